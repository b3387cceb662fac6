"""How a boundary's hidden states are laid out in Lance: ``raw`` or a lossless byte split (``zstd``, ``zstd_fast``).

``raw`` (boundary format 2): one ``hidden`` column, a fixed-size list of the storage dtype's
bits per row (bf16 as uint16), readable with plain lance/pyarrow.

``zstd`` (boundary format 3): bf16 values carry most of their entropy in the low byte
(mantissa); the high byte (sign and exponent) takes few values and compresses well, while
the low byte does not compress at all. So each row's values are split into byte planes:
``hidden_hi`` holds the zstd frame of the most significant byte of every value (one binary
per row, so rows stay randomly readable), ``hidden_lo`` the other bytes, stored as they
are. Measured on SmolLM2-135M's inner boundaries: 0.72 of raw (docs/results/benchmarks.md). Lance 14's own
field encodings (``lance-encoding:compression`` zstd/lz4, ``lance-encoding:bss``) left these
wide fixed-size-list rows at 1.00 of raw (bench/compression.py), hence this layout.

``zstd_fast`` (boundary format 4) is the same layout with the high bytes compressed by zstd's fast
strategy and small match tables (``zstandard``; ``ZSTD_FAST``): on bf16 high bytes, which are mostly
literals for the entropy coder, it measured 3-4x the speed of level 3 at the same size or smaller
(bench/write_path.py, docs/results/write-path.md). Its frames are plain zstd frames; one decoder reads both.

``blob`` (boundary format 5) holds the same bits as ``raw``, each row as one Lance blob (Lance's blob v2 column,
``lance.blob.blob_field``): the data file keeps a descriptor per row and the rows' bytes follow one another in a
packed sidecar, ``data/<data file stem>/<blob file id>.blob`` (one per data file: zg sets Lance's pack threshold
to 1 TiB), so writing them is a plain file write, not Lance's page encoder (15-25% less CPU per GB of the whole
write path than a fixed-size list: docs/results/write-path.md). Lance reads the bytes with ``take_blobs``; zg maps
the sidecars (zgdata/store/blobs.py). Rows never stay inline nor get a file each, whatever their size.

``int8`` and ``int6`` (boundary format 4, the checksum format) are lossy: zgdata/store/quant.py. Columns:
``hidden_q`` the zstd frame (zstd_fast's parameters) of the row's T*C int8 values, ``hidden_scale`` T float32
per-token scales, ``hidden_oidx`` / ``hidden_oval`` the T*k outlier channels (uint16) and their bf16 bits. The
stored values are ``quant.dequantize`` of those; the checksum is of those decoded bits. A quantized codec IS
lineage: its parameters (``quant.scheme``) are in the lineage and the fingerprint, and the online path applies
the same quantization (``quant.roundtrip``).

The lossless layouts decode to exactly the stored bits; the per-row checksum (zgdata/store/integrity.py)
is of those decoded bits in either layout, so a checksum also proves a lossless decode. The
lossless codec is a storage choice, never lineage: the fingerprint does not depend on it, and it is
recorded in the schema metadata as ``zg.codec``.

This module holds the layouts and the encoding (what materialize writes: a dep of its DVC stage); the decoding of
stored rows, on a pool of threads, is zgdata/store/decode.py (``decode_rows`` here dispatches to it).
"""

from __future__ import annotations

import functools
import json
import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from zgdata.capture_version import BOUNDARY_FORMAT_VERSION
from zgdata.errors import ZgError
from zgdata.store.decode import decode_planes, decode_quantized, flat_values, row_buffers
from zgdata.store.quant import QUANT, is_quantized, quantize, scheme

if TYPE_CHECKING:  # torch loads where a tensor is encoded (`zg data inspect` reads the schema only)
    import torch

__all__ = [
    "CODECS",
    "ZSTD_LEVEL",
    "ZSTD_FAST",
    "FORMAT_OF",
    "FORMATS",
    "CHECKSUM_FORMAT",
    "format_of",
    "hidden_fields",
    "hidden_arrays",
    "decode_rows",
    "codec_of",
    "hidden_columns",
    "value_info",
    "codec_meta",
    "planes",
]

CODECS = ("raw", "blob", "zstd", "zstd_fast", "zstd_blob", *QUANT)
LOSSLESS = ("raw", "blob", "zstd", "zstd_fast", "zstd_blob")
# the codecs whose value columns are Lance blobs, their bytes in packed sidecar files (zgdata/store/blobs.py): blob's
# rows; zstd_blob's two planes, zstd_fast's bytes. Lance's writer of a list or binary value column costs 3-4 core-s
# per GB at an 8B teacher's 16 MB rows, its blobs 0.3-0.4 (docs/results/write-path.md)
BLOB_CODECS = ("blob", "zstd_blob")
ZSTD_LEVEL = 3  # higher levels gained < 1% on bf16 high bytes at several times the encode cost
# zstd_fast: the fast strategy with match tables that stay in L1/L2 (hash 2**10); the high bytes are mostly
# literals, so the Huffman stage gives the size and a wide match search only costs time (bench/write_path.py)
ZSTD_FAST = {"strategy": "fast", "window_log": 17, "hash_log": 10, "chain_log": 10, "search_log": 1, "min_match": 7}
# boundary format written for each codec with the blake2b row checksum: raw keeps format 2 (a zg without codecs
# reads it); a zg without codecs refuses format 3 with "rematerialize" instead of failing on missing columns
FORMAT_OF = {"raw": BOUNDARY_FORMAT_VERSION, "zstd": BOUNDARY_FORMAT_VERSION + 1}
# format 4: the row checksum's algorithm is named in zg.checksum (zgdata/store/integrity.py), any codec; a zg that
# predates it refuses it with "rematerialize" rather than report every row's (xxh3) checksum as a mismatch
CHECKSUM_FORMAT = BOUNDARY_FORMAT_VERSION + 2
# format 5: the blob layout (a zg that predates it would read the descriptors as values); its checksum is named too.
# zstd_blob is format 5 too: a zg of format 5 that predates it refuses the codec's name (``codec_of``)
BLOB_FORMAT = BOUNDARY_FORMAT_VERSION + 3
FORMATS = (*FORMAT_OF.values(), CHECKSUM_FORMAT, BLOB_FORMAT)
# a blob row goes to the packed sidecar whatever its size: never inline (0), never a file of its own (an 8B teacher's
# 2048 x 4096 bf16 row is 16 MiB; Lance's default gives each row over 4 MiB its own file); and one sidecar per data
# file (Lance's default starts a new one every GiB: a 64-GiB boundary would hold 64 open mapped files per reader)
BLOB_INLINE_MAX, BLOB_DEDICATED_MIN, BLOB_PACK_MAX = 0, 1 << 40, 1 << 40


def format_of(codec: str, checksum: str) -> int:
    """The boundary format a dataset of ``codec`` with row checksum ``checksum`` is written in."""
    if codec in BLOB_CODECS:
        return BLOB_FORMAT
    if checksum == "blake2b" and codec in FORMAT_OF:
        return FORMAT_OF[codec]  # exactly what zg wrote before format 4: same metadata, same bytes
    return CHECKSUM_FORMAT


_NP = {"bfloat16": np.uint16, "float32": np.float32}
_LOCAL = threading.local()  # each thread's zstd_fast compressor
_ARROW = {"bfloat16": pa.uint16(), "float32": pa.float32()}


def _zstd() -> pa.Codec:
    return pa.Codec("zstd", compression_level=ZSTD_LEVEL)


def _fast_compressor():
    """This thread's zstd_fast compressor (a ZstdCompressor must not be used by two threads at once)."""
    c = getattr(_LOCAL, "fast", None)
    if c is None:
        import zstandard

        p = {k: v for k, v in ZSTD_FAST.items() if k != "strategy"}
        params = zstandard.ZstdCompressionParameters(strategy=zstandard.STRATEGY_FAST, **p)
        c = _LOCAL.fast = zstandard.ZstdCompressor(compression_params=params)
    return c


def codec_meta(codec: str) -> dict:
    """What ``zg.codec`` records for ``codec``."""
    if codec == "raw":
        return {"name": "raw"}
    if codec == "blob":
        return {"name": codec, "layout": "blob", "sidecar": "packed"}
    if is_quantized(codec):
        return {**scheme(codec), "layout": "quantized", "compressed": "hidden_q", "zstd": ZSTD_FAST}
    if codec == "zstd_fast":
        return {"name": codec, "layout": "bytesplit", "compressed": "hidden_hi", "zstd": ZSTD_FAST}
    if codec == "zstd_blob":
        return {"name": codec, "layout": "blob", "sidecar": "packed", "compressed": "hidden_hi", "zstd": ZSTD_FAST}
    return {"name": codec, "layout": "bytesplit", "compressed": "hidden_hi", "zstd_level": ZSTD_LEVEL}


def codec_of(meta: dict) -> str:
    """The codec of a boundary dataset from its zg.* schema metadata (format 2 datasets are raw)."""
    c = meta.get("codec") or {"name": "raw"}
    name = c.get("name") if isinstance(c, dict) else c
    if name not in CODECS:
        raise ZgError(
            f"boundary codec {name!r} is unknown to this zg (it reads {', '.join(CODECS)})",
            fix="install the zg that wrote it, or rematerialize with `dvc repro -f materialize`",
        )
    return name


def hidden_columns(codec: str) -> list[str]:
    if is_quantized(codec):
        return ["hidden_q", "hidden_scale", "hidden_oidx", "hidden_oval"]
    return ["hidden"] if codec in ("raw", "blob") else ["hidden_hi", "hidden_lo"]  # zstd_blob: two blob columns


def hidden_fields(seq_len: int, hidden: int, storage_dtype: str, codec: str) -> list[pa.Field]:
    """The schema fields holding the values; the first carries zg.dtype and zg.shape."""
    meta = {"zg.dtype": storage_dtype, "zg.shape": json.dumps([seq_len, hidden])}
    n = seq_len * hidden
    if codec == "raw":
        return [pa.field("hidden", pa.list_(_ARROW[storage_dtype], n), metadata=meta)]
    if codec in BLOB_CODECS:
        from lance.blob import blob_field

        fs = [
            blob_field(
                c,
                inline_size_threshold=BLOB_INLINE_MAX,
                dedicated_size_threshold=BLOB_DEDICATED_MIN,
                pack_file_size_threshold=BLOB_PACK_MAX,
            )
            for c in hidden_columns(codec)
        ]
        return [fs[0].with_metadata({**fs[0].metadata, **{k.encode(): v.encode() for k, v in meta.items()}}), *fs[1:]]
    if is_quantized(codec):
        return [
            pa.field("hidden_q", pa.large_binary(), metadata=meta),
            pa.field("hidden_scale", pa.list_(pa.float32(), seq_len)),
            pa.field("hidden_oidx", pa.list_(pa.uint16())),
            pa.field("hidden_oval", pa.list_(pa.uint16())),
        ]
    nbytes = np.dtype(_NP[storage_dtype]).itemsize
    return [
        pa.field("hidden_hi", pa.large_binary(), metadata=meta),
        pa.field("hidden_lo", pa.list_(pa.uint8(), n * (nbytes - 1))),
    ]


def value_info(schema: pa.Schema, meta: dict) -> tuple[str, int, int]:
    """(storage dtype, seq_len, hidden) of a boundary dataset's schema."""
    f = schema.field(hidden_columns(codec_of(meta))[0])
    t, c = json.loads(f.metadata[b"zg.shape"])
    return f.metadata[b"zg.dtype"].decode(), t, c


def planes(x: torch.Tensor, storage_dtype: str) -> np.ndarray:
    """(B, T, C) tensor in the storage dtype -> (B, T*C) numpy array of its bits (a view when possible)."""
    import torch

    flat = x.contiguous().reshape(x.shape[0], -1)
    if storage_dtype == "bfloat16":
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


def _split(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, n) rows of bits -> (the (B, n) most significant bytes, the other bytes of each value in order, flat)."""
    if rows.dtype == np.uint16:  # bf16: a shift and a narrowing cast, vectorized (a strided byte gather is 3-5x slower)
        hi = np.empty(rows.shape, np.uint8)  # the shift casts as it writes: one pass, not a shift then a cast (0.6x)
        np.right_shift(rows, 8, out=hi, casting="unsafe")
        return hi, rows.astype(np.uint8).reshape(-1)
    b, n = rows.shape
    by = rows.view(np.uint8).reshape(b, n, rows.dtype.itemsize)  # little endian: the last byte is sign + exponent
    return np.ascontiguousarray(by[:, :, -1]), np.ascontiguousarray(by[:, :, :-1]).reshape(-1)


def hidden_arrays(x: torch.Tensor, storage_dtype: str, codec: str) -> tuple[list[pa.Array], np.ndarray]:
    """Encode a (B, T, C) batch: (the value columns in schema order, the (B, T*C) raw rows for checksums)."""
    rows = planes(x, storage_dtype)
    b, n = rows.shape
    if is_quantized(codec):
        return _quantized_arrays(rows.reshape(x.shape), codec)
    if codec == "raw":
        values = pa.array(rows.reshape(-1), type=_ARROW[storage_dtype])
        return [pa.FixedSizeListArray.from_arrays(values, n)], rows
    if codec == "blob":
        return [_blob_array(_rows_array(rows))], rows
    nbytes = rows.dtype.itemsize
    his, lo = _split(rows)
    if codec in ("zstd_fast", "zstd_blob"):  # the same frames; zstd_blob stores them and the low bytes as blobs
        z = _fast_compressor()
        hi = [z.compress(his[i]) for i in range(b)]
    else:
        z = _zstd()
        hi = [z.compress(his[i], asbytes=True) for i in range(b)]
    if codec == "zstd_blob":
        return [_blob_array(frames_array(hi)), _blob_array(_rows_array(lo, b))], rows
    return [
        frames_array(hi),
        pa.FixedSizeListArray.from_arrays(pa.array(lo, type=pa.uint8()), n * (nbytes - 1)),
    ], rows


def frames_array(frames: list) -> pa.Array:
    """Compressed frames (bytes) as one ``large_binary`` array: the same array as ``pa.array(frames,
    type=pa.large_binary())``, but its bytes are copied by numpy, which lets go of the GIL, where pyarrow's
    conversion of Python objects holds it throughout (15% of the GIL the encoding threads held, by py-spy
    --gil). ``python bench/encode_pool.py --codecs zstd_fast --rounds 6``: two threads 1.20 GB/s against 1.13, the
    speedup over one thread a median 1.78 against 1.68 (arm ``pyframes``)."""
    offsets = np.zeros(len(frames) + 1, dtype=np.int64)
    np.cumsum([len(f) for f in frames], out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for i, f in enumerate(frames):
        data[offsets[i] : offsets[i + 1]] = np.frombuffer(f, dtype=np.uint8)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(frames), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _rows_array(rows: np.ndarray, b: int | None = None) -> pa.Array:
    """(B, n) rows of bits (or their bytes flat, ``b`` rows) -> a ``large_binary`` array of B rows (no copy)."""
    b = len(rows) if b is None else b
    rows = np.ascontiguousarray(rows)
    offsets = np.arange(b + 1, dtype=np.int64) * (rows.nbytes // b) if b else np.zeros(1, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), b, [None, pa.py_buffer(offsets), pa.py_buffer(rows)])


@functools.lru_cache(maxsize=16)
def _blob_parts(b: int) -> tuple:
    """Lance's blob type, its storage fields and the null columns of ``b`` rows (uri, position, size: the bytes are
    inline), made once per row count: building them held the GIL some 40 us a column (two in a zstd_blob job)."""
    from lance.blob import BlobType

    typ = BlobType()
    fields = list(typ.storage_type)
    return typ, fields, [pa.nulls(b, f.type) for f in fields[1:]]


def _blob_array(data: pa.Array) -> pa.Array:
    """A ``large_binary`` array -> a Lance blob column of its rows, each row's bytes in the packed sidecar."""
    typ, fields, nulls = _blob_parts(len(data))
    return pa.ExtensionArray.from_storage(typ, pa.StructArray.from_arrays([data, *nulls], fields=fields))


def _quantized_arrays(bits: np.ndarray, codec: str) -> tuple[list[pa.Array], np.ndarray]:
    """A (B, T, C) bf16 batch's quantized columns, and the (B, T*C) bits they decode to (for the checksums)."""
    from zgdata.store.quant import dequantize

    if bits.dtype != np.uint16:
        raise ZgError(f"materialize.codec {codec} quantizes bfloat16 only", key="materialize.storage_dtype")
    b, t, c = bits.shape
    q, scale, idx, val = quantize(bits, codec)
    z = _fast_compressor()

    def lists(a: np.ndarray, typ) -> pa.Array:
        k = a.shape[-1] if a.ndim == 3 else 1
        offsets = pa.array(np.arange(b + 1, dtype=np.int32) * (t * k))
        return pa.ListArray.from_arrays(offsets, pa.array(a.reshape(-1), type=typ))

    cols = [
        frames_array([z.compress(q[i].tobytes()) for i in range(b)]),
        pa.FixedSizeListArray.from_arrays(pa.array(scale.reshape(-1), type=pa.float32()), t),
        lists(idx, pa.uint16()),
        lists(val, pa.uint16()),
    ]
    return cols, dequantize(q, scale, idx, val).reshape(b, t * c)


def decode_rows(
    table,
    codec: str,
    storage_dtype: str,
    seq_len: int,
    hidden: int,
    *,
    strict: bool = True,
    out=None,
    lo=None,
    hi=None,
) -> np.ndarray:
    """(N, T*C) numpy array of the stored bits (uint16 for bf16) of a table holding ``hidden_columns(codec)``.

    A row whose compressed bytes do not decode raises ValueError; with ``strict=False`` its high
    bytes are left zero instead, so its checksum fails and verify reports it with the others.
    ``out``: a C-contiguous (N, T*C) array of the storage dtype, or a list of N such (T*C,) rows, to decode into (and
    return), instead of a new one: the decoded-row cache passes its own rows, which spares a copy and fresh memory
    per read.
    ``lo``: a byte-split codec's low bytes of the same rows, (N, T*C*(bytes-1)) uint8 or a list of N such rows (views
    onto the reader's mapped pages, zgdata/store/pagemap.py), already read; then ``table`` needs only ``hidden_hi``.
    ``hi``: the N rows' compressed high bytes (buffers: views onto a ``zstd_blob`` boundary's mapped sidecars), with
    ``lo``; then ``table`` is not read."""
    n = seq_len * hidden
    if is_quantized(codec):
        return decode_quantized(table, seq_len, hidden, strict, out)
    if codec == "blob" or (codec == "zstd_blob" and (hi is None or lo is None)):
        # the table holds descriptors only: BoundaryDataset reads the sidecars (zgdata/store/blobs.py)
        raise ValueError(f"a {codec} boundary's values are read from its sidecar files, not from a Lance table")
    if codec == "raw":
        flat = flat_values(table.column("hidden"), n)
        if out is None:
            return flat
        out[...] = flat
        return out
    nbytes = np.dtype(_NP[storage_dtype]).itemsize
    if lo is None:
        lo = flat_values(table.column("hidden_lo"), n * (nbytes - 1))
    bufs = hi if hi is not None else row_buffers(table.column("hidden_hi"))
    return decode_planes(bufs, lo, n, _NP[storage_dtype], strict, out)

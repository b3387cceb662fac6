"""How a boundary's hidden states are laid out in Lance: ``raw`` or the lossless ``zstd`` byte split.

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

Both layouts decode to exactly the stored bits; the per-row checksum (zgdata/store/integrity.py)
is of those decoded bits in either layout, so a checksum also proves a lossless decode. The
codec is a storage choice, never lineage: the fingerprint does not depend on it, and it is
recorded in the schema metadata as ``zg.codec``.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from zgdata.capture_version import BOUNDARY_FORMAT_VERSION
from zgdata.errors import ZgError

if TYPE_CHECKING:  # torch loads where a tensor is encoded (`zg data inspect` reads the schema only)
    import torch

__all__ = [
    "CODECS",
    "ZSTD_LEVEL",
    "FORMAT_OF",
    "hidden_fields",
    "hidden_arrays",
    "decode_rows",
    "codec_of",
    "hidden_columns",
    "value_info",
    "codec_meta",
]

CODECS = ("raw", "zstd")
ZSTD_LEVEL = 3  # higher levels gained < 1% on bf16 high bytes at several times the encode cost
# boundary format written for each codec: raw keeps format 2 (a zg without codecs reads it); a zg
# without codecs refuses format 3 with "rematerialize" instead of failing on missing columns
FORMAT_OF = {"raw": BOUNDARY_FORMAT_VERSION, "zstd": BOUNDARY_FORMAT_VERSION + 1}
_NP = {"bfloat16": np.uint16, "float32": np.float32}
_ARROW = {"bfloat16": pa.uint16(), "float32": pa.float32()}


def _zstd() -> pa.Codec:
    return pa.Codec("zstd", compression_level=ZSTD_LEVEL)


def codec_meta(codec: str) -> dict:
    """What ``zg.codec`` records for ``codec``."""
    if codec == "raw":
        return {"name": "raw"}
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
    return ["hidden"] if codec == "raw" else ["hidden_hi", "hidden_lo"]


def hidden_fields(seq_len: int, hidden: int, storage_dtype: str, codec: str) -> list[pa.Field]:
    """The schema fields holding the values; the first carries zg.dtype and zg.shape."""
    meta = {"zg.dtype": storage_dtype, "zg.shape": json.dumps([seq_len, hidden])}
    n = seq_len * hidden
    if codec == "raw":
        return [pa.field("hidden", pa.list_(_ARROW[storage_dtype], n), metadata=meta)]
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


def _planes(x: torch.Tensor, storage_dtype: str) -> np.ndarray:
    """(B, T, C) tensor in the storage dtype -> (B, T*C) numpy array of its bits (a view when possible)."""
    import torch

    flat = x.contiguous().reshape(x.shape[0], -1)
    if storage_dtype == "bfloat16":
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


def hidden_arrays(x: torch.Tensor, storage_dtype: str, codec: str) -> tuple[list[pa.Array], np.ndarray]:
    """Encode a (B, T, C) batch: (the value columns in schema order, the (B, T*C) raw rows for checksums)."""
    rows = _planes(x, storage_dtype)
    b, n = rows.shape
    if codec == "raw":
        values = pa.array(rows.reshape(-1), type=_ARROW[storage_dtype])
        return [pa.FixedSizeListArray.from_arrays(values, n)], rows
    nbytes = rows.dtype.itemsize
    by = rows.view(np.uint8).reshape(b, n, nbytes)  # little endian: the last byte is sign + exponent
    z = _zstd()
    hi = [z.compress(np.ascontiguousarray(by[i, :, -1]), asbytes=True) for i in range(b)]
    lo = np.ascontiguousarray(by[:, :, :-1]).reshape(-1)
    return [
        pa.array(hi, type=pa.large_binary()),
        pa.FixedSizeListArray.from_arrays(pa.array(lo, type=pa.uint8()), n * (nbytes - 1)),
    ], rows


def _flat_values(col, width: int) -> np.ndarray:
    """A fixed-size-list column (array or chunked) as one (N, width) numpy array; zero-copy for one chunk."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    arrs = [
        ch.values.slice(ch.offset * width, len(ch) * width).to_numpy(zero_copy_only=True).reshape(len(ch), width)
        for ch in chunks
        if len(ch)
    ]
    if len(arrs) == 1:
        return arrs[0]
    if not arrs:
        return np.zeros((0, width), dtype=chunks[0].type.value_type.to_pandas_dtype() if chunks else np.uint8)
    return np.concatenate(arrs)


def decode_rows(table, codec: str, storage_dtype: str, seq_len: int, hidden: int, *, strict: bool = True) -> np.ndarray:
    """(N, T*C) numpy array of the stored bits (uint16 for bf16) of a table holding ``hidden_columns(codec)``.

    A row whose compressed bytes do not decode raises ValueError; with ``strict=False`` its high
    bytes are left zero instead, so its checksum fails and verify reports it with the others."""
    n = seq_len * hidden
    if codec == "raw":
        return _flat_values(table.column("hidden"), n)
    nbytes = np.dtype(_NP[storage_dtype]).itemsize
    lo = _flat_values(table.column("hidden_lo"), n * (nbytes - 1)).reshape(-1, n, nbytes - 1)
    out = np.empty((len(lo), n, nbytes), dtype=np.uint8)
    out[:, :, :-1] = lo
    col = table.column("hidden_hi")
    bufs = [
        ch[j].as_buffer() for ch in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]) for j in range(len(ch))
    ]

    def one(i: int) -> str | None:
        """Decode row i's high bytes into ``out``; an error text if they do not decode."""
        try:
            hi = _zstd().decompress(bufs[i], decompressed_size=n, asbytes=False)
            if hi.size != n:
                return f"{hi.size} bytes, not {n}"
            out[i, :, -1] = np.frombuffer(hi, dtype=np.uint8)
            return None
        except (ValueError, OSError, pa.ArrowException) as e:
            out[i, :, -1] = 0
            return str(e)

    # zstd and numpy's copies release the GIL: rows decode in parallel threads
    errors = list(_pool().map(one, range(len(bufs)))) if len(bufs) > 1 else [one(i) for i in range(len(bufs))]
    bad = [(i, e) for i, e in enumerate(errors) if e is not None]
    if bad and strict:  # the reader names the dataset and the rows
        i, e = bad[0]
        raise ValueError(f"the compressed high bytes of the {i}th row read do not decode ({e})")
    return out.reshape(len(lo), n * nbytes).view(_NP[storage_dtype])


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="zg-zstd")
    return _POOL

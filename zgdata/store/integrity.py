"""End-to-end integrity of boundary data: a checksum per row, and read errors that say what to do.

Lance stores a bf16 boundary's values uncompressed and keeps no checksum of its pages, so
a flipped byte in a data file reads back as silently different activations. Materialize
therefore writes, next to each row's hidden states, a 128-bit digest of exactly the bytes
it stored; every read (training, verify, evaluate) recomputes it. The digest covers the
values only: it says "these are the bytes materialize wrote", while the fingerprint says
what those bytes mean (lineage). The column is part of the boundary format, never of the
fingerprint.

The digest guards against accidents only: the root of trust is the md5 that git's ``dvc.lock``
records (zgdata/trust/dvc_lock.py, docs/SECURITY.md). So it is a fast non-cryptographic hash:
xxh3-128 (``xxhash``), measured at 27-31 GB/s on one core of the 2-core machine against 2.7 for
blake3 and 0.67-1.3 for blake2b (bench/write_path.py). Datasets written before it (boundary
formats 2 and 3) hold blake2b-128 and keep reading and verifying with it: the algorithm is
recorded as ``zg.checksum`` (format 4), and a dataset without it is blake2b.

hashlib (blake2b) and xxhash 4 release the GIL on buffers this large (over 64 KB; xxhash 3's one-shot
``xxh3_128_digest`` held it throughout, hence ``xxhash>=4`` in pyproject.toml), so the check overlaps with
training when batches are loaded ahead in a thread (``BoundaryPair.batches``) and the encoding pool's
threads hash on every core (tests/zgdata/test_integrity.py holds xxhash to it).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from zgdata.capture_version import BOUNDARY_FORMAT_VERSION
from zgdata.errors import ZgError, dvc_checkout, dvc_pull

__all__ = [
    "CHECKSUM_COLUMN",
    "CHECKSUM_BYTES",
    "CHECKSUMS",
    "WRITE_CHECKSUM",
    "checksum_of",
    "row_checksum",
    "hidden_checksums",
    "checksum_array",
    "digests",
    "mismatched_rows",
    "check_rows",
    "check_format",
    "recover_fix",
    "read_error",
    "is_read_error",
    "guarded",
    "scan_checksums",
]

CHECKSUM_COLUMN = "checksum"
CHECKSUM_BYTES = 16  # 128 bits: collisions are irrelevant next to 1e-20-level random corruption odds
CHECKSUMS = ("blake2b", "xxh3_128")  # blake2b: boundary formats 2 and 3; xxh3_128 from format 4
WRITE_CHECKSUM = "xxh3_128"  # what materialize writes (tests set blake2b to write a dataset as an older zg did)


def checksum_of(meta: dict) -> str:
    """The row checksum algorithm of a boundary dataset from its zg.* metadata (formats 2 and 3: blake2b)."""
    name = meta.get("checksum") or "blake2b"
    if name not in CHECKSUMS:
        raise ZgError(
            f"boundary row checksum {name!r} is unknown to this zg (it reads {', '.join(CHECKSUMS)})",
            fix="install the zg that wrote it, or rematerialize with `dvc repro -f materialize`",
        )
    return name


def _hasher(algo: str):
    if algo == "xxh3_128":
        import xxhash  # imported where rows are hashed: `zg data inspect` reads the schema only

        return xxhash.xxh3_128_digest
    if algo == "blake2b":
        return lambda buf: hashlib.blake2b(buf, digest_size=CHECKSUM_BYTES).digest()
    checksum_of({"checksum": algo})  # raises the one-line error
    raise AssertionError(algo)


def row_checksum(buf, *, algo: str) -> bytes:
    """The checksum of one row: ``algo`` (xxh3_128 or blake2b-128) of its stored hidden bytes (a C-contiguous
    buffer; numpy rows are hashed as their bytes)."""
    if isinstance(buf, np.ndarray):
        buf = buf.view(np.uint8)  # xxhash and blake3 take only byte buffers; the digest is of the same bytes
    return _hasher(algo)(buf)


def _sums(rows, algo: str) -> list[bytes]:
    h = _hasher(algo)
    return [h(r.view(np.uint8) if isinstance(r, np.ndarray) else r) for r in rows]


def _row_views(col) -> list[np.ndarray]:
    """Each row of a fixed-size-list hidden column (array or chunked) as a zero-copy 1-D numpy view."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = []
    for ch in chunks:
        if not len(ch):
            continue
        size = ch.type.list_size
        vals = ch.values.slice(ch.offset * size, len(ch) * size).to_numpy(zero_copy_only=True)
        out.extend(vals.reshape(len(ch), size))
    return out


def hidden_checksums(col, *, algo: str) -> list[bytes]:
    """Checksums of every row of a hidden column, in order."""
    return _sums(_row_views(col), algo)


def checksum_array(col, *, algo: str) -> pa.Array:
    """The ``checksum`` column materialize writes: of a raw hidden column, or of (N, T*C) numpy rows of bits."""
    sums = _sums(col, algo) if isinstance(col, np.ndarray) else hidden_checksums(col, algo=algo)
    # from one buffer: pa.array(sums, type=binary(16)) converts each bytes object holding the GIL (42 us a batch of 4)
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(CHECKSUM_BYTES), len(sums), [None, pa.py_buffer(b"".join(sums))]
    )


def digests(col) -> np.ndarray:
    """A ``checksum`` column (array or chunked, ``binary(16)``) as one (N, 16) uint8 array: a reader keeps it."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [
        np.frombuffer(ch.buffers()[1], np.uint8)[ch.offset * CHECKSUM_BYTES : (ch.offset + len(ch)) * CHECKSUM_BYTES]
        for ch in chunks
        if len(ch)
    ]
    return np.concatenate(parts).reshape(-1, CHECKSUM_BYTES) if parts else np.zeros((0, CHECKSUM_BYTES), np.uint8)


def mismatched_rows(table, values: np.ndarray | None = None, *, algo: str) -> list[int]:
    """Positions (0-based, within ``table``) whose hidden bits do not match their stored checksum.

    ``table``: a table holding the ``checksum`` column, or the stored digests themselves as an (N, 16) uint8
    array (``digests``: what a reader keeps, so that each read compares arrays, not Python bytes per row).
    ``values``: the rows' decoded bits, (N, T*C) (zgdata/store/codec.py); default the raw ``hidden`` column.
    ``algo``: the dataset's algorithm (``checksum_of(meta)``)."""
    got = _sums(values, algo) if values is not None else hidden_checksums(table.column("hidden"), algo=algo)
    if isinstance(table, np.ndarray):
        if len(got) == len(table) and b"".join(got) == table.tobytes():  # the usual case: one comparison
            return []
        stored = [row.tobytes() for row in table]
    else:
        stored = table.column(CHECKSUM_COLUMN).to_pylist()
    return [i for i, (want, have) in enumerate(zip(stored, got)) if want != have]


def recover_fix(path: Path, kind: str | None = None) -> str:
    """What to do about a damaged dataset: restore the tracked copy, or re-create it (with the stage that writes
    it: tokens, materialize, or in local pretraining the local_bNN stage whose output it is)."""
    restore = f"restore it with `{dvc_checkout(path)}` (or `{dvc_pull(path)}`), or re-create it with "
    if kind == "local_boundary":
        return restore + "`dvc repro -f local_bNN`, bNN the block that writes it (`dvc stage list` names the outputs)"
    return restore + f"`dvc repro -f {'tokens' if kind == 'tokens' else 'materialize'}`"


def check_rows(path: Path, table, rows, seq_ids, values: np.ndarray | None = None, *, algo: str) -> None:
    """Raise if any row of ``table`` (read from ``path``; dataset row numbers ``rows``) fails its checksum."""
    bad = mismatched_rows(table, values, algo=algo)
    if not bad:
        return
    r = int(rows[bad[0]])
    more = f" (and {len(bad) - 1} more of the {len(rows)} rows read)" if len(bad) > 1 else ""
    raise ZgError(
        f"{path} row {r} (seq_id {int(seq_ids[r])}) does not match its checksum: its hidden states "
        f"changed after materialize wrote them{more}",
        fix=recover_fix(path),
    )


def check_format(path: Path, schema: pa.Schema, meta: dict) -> None:
    """Refuse a boundary dataset written in another format (e.g. before per-row checksums)."""
    from zgdata.store.codec import FORMATS, codec_of, format_of

    have = meta.get("format_version")
    field = schema.field(CHECKSUM_COLUMN) if CHECKSUM_COLUMN in schema.names else None
    codec, algo = codec_of(meta), checksum_of(meta)
    ok = have == format_of(codec, algo)
    if ok and field is not None and field.type == pa.binary(CHECKSUM_BYTES):
        return
    if have is None:
        what = (
            f"was written before boundary format {BOUNDARY_FORMAT_VERSION} (no zg.format_version, no per-row checksums)"
        )
    elif have not in FORMATS:
        what = f"has boundary format {have}, but this zg reads formats {', '.join(map(str, FORMATS))}"
    elif not ok:
        what = f"has boundary format {have}, which does not match its codec {codec!r} and checksum {algo!r}"
    else:
        what = f"claims boundary format {have} but has no valid `{CHECKSUM_COLUMN}` column"
    raise ZgError(
        f"{path} {what}",
        fix="rematerialize it with `dvc repro -f materialize` (or pull boundaries written by a current zg)",
    )


def is_read_error(e: BaseException) -> bool:
    """Whether ``e`` is Lance's or Arrow's report of a damaged or missing file (its Rust panics included)."""
    # Lance raises OSError / ValueError (ArrowInvalid) for damaged or missing files, and pyo3
    # turns a Rust panic into PanicException, which derives from BaseException only.
    return isinstance(e, (OSError, ValueError, RuntimeError, pa.ArrowException)) or type(e).__name__ == "PanicException"


def read_error(path: Path, kind: str | None, e: BaseException) -> ZgError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    first = re.sub(r",?\s*/rustc/\S*", "", first)[:160]  # the Rust source location helps no user
    return ZgError(
        f"cannot read {path}: a data file is truncated, corrupt or missing ({first})", fix=recover_fix(path, kind)
    )


class _Guarded:
    """A Lance dataset whose reads turn Arrow/Lance errors into one-line ZgErrors naming the dataset.

    Everything else (schema, version, versions(), get_fragments(), ...) is the dataset's own;
    ``scanner()`` is not wrapped, so stream with ``to_batches``.
    """

    _READS = ("take", "to_table", "count_rows", "head", "sample")

    def __init__(self, ds, path: Path, kind: str | None):
        self.lance_dataset, self._path, self._kind = ds, Path(path), kind

    def __getattr__(self, name):
        if name.startswith("__") or name == "lance_dataset":  # copy/pickle probes, half-built instance
            raise AttributeError(name)
        attr = getattr(self.lance_dataset, name)
        if name in self._READS:
            return self._wrap(attr)
        if name == "to_batches":
            return self._wrap_iter(attr)
        return attr

    def _wrap(self, fn):
        def call(*a, **k):
            try:
                return fn(*a, **k)
            except BaseException as e:
                if isinstance(e, ZgError) or not is_read_error(e):
                    raise
                raise read_error(self._path, self._kind, e) from e

        return call

    def _wrap_iter(self, fn):
        def gen(*a, **k):
            try:
                yield from fn(*a, **k)
            except BaseException as e:
                if isinstance(e, (ZgError, GeneratorExit)) or not is_read_error(e):
                    raise
                raise read_error(self._path, self._kind, e) from e

        return gen

    def __repr__(self) -> str:
        return f"<zg dataset {self._path} v{self.lance_dataset.version}>"


def guarded(ds, path: Path, kind: str | None):
    return _Guarded(ds, path, kind)


def scan_checksums(
    ds, row_bytes: int, *, algo: str, batch_bytes: int = 16 << 20, columns=("hidden",), decode=None
) -> tuple[int, list[tuple[int, int]]]:
    """Check every row's checksum, streaming about ``batch_bytes`` at a time (never the whole dataset).

    ``columns``/``decode``: the value columns and a (batch, its row numbers) -> (N, T*C) bits decoder
    (zgdata/store/codec.py); default the raw ``hidden`` column. Returns (rows checked, [(row, seq_id) of each row
    that fails]).
    """
    n, bad = 0, []
    for rb in ds.to_batches(columns=["seq_id", *columns, CHECKSUM_COLUMN], batch_size=max(1, batch_bytes // row_bytes)):
        seq = rb.column("seq_id")
        values = decode(rb, np.arange(n, n + rb.num_rows)) if decode else None
        bad += [(n + i, int(seq[i].as_py())) for i in mismatched_rows(rb, values, algo=algo)]
        n += rb.num_rows
    return n, bad

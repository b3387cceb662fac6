"""Decoding a boundary's stored rows on a pool of threads: zstd frames, the byte split's planes, Arrow columns.

``codec.decode_rows`` reads a table, or a ``zstd_blob`` boundary's mapped sidecars, through these. Each row's zstd
frame is decoded into its thread's scratch buffer (``decompress_into``), then joined with the row's low bytes
straight into the caller's row (``decode_planes``) or dequantized (``decode_quantized``): a row a job on the
process's decoding pool (``pool_threads``; zstd and numpy's copies release the GIL). A row that does not decode
raises ValueError naming it, or with ``strict=False`` has its high bytes (a quantized row: its int values) left
zero, so that its checksum fails and verify reports it with the others.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa

from zgdata.core.runtime import cores

__all__ = ["decompress_into", "decode_planes", "decode_quantized", "flat_values", "row_buffers", "pool_threads"]

_POOL = None
_POOL_LOCK = threading.Lock()
_LOCAL = threading.local()
_ERRORS = (ValueError, OSError, pa.ArrowException)  # what a damaged frame or a null row raises


def _after_fork() -> None:
    """A forked child (a DataLoader worker) inherits the pool object but none of its threads: a map on it would
    wait forever. The child makes its own pool, under a lock no thread of the parent can hold."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def pool_threads() -> int:
    """The decoding pool's threads: the cores this process may use (``runtime.cores``), at most 8."""
    return min(8, cores())


def _pool():
    """The process's decoding threads, made once (two readers' threads asking at once get the same pool)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(pool_threads(), thread_name_prefix="zg-zstd")
        return _POOL


def _each_row(n_rows: int, one, strict: bool, what: str) -> None:
    """``one(i)`` for every row i on the pool (in this thread for one row); ``one`` returns an error text or None.
    With ``strict``, the first row's error raises ValueError (the reader names the dataset and the rows)."""
    errors = list(_pool().map(one, range(n_rows))) if n_rows > 1 else [one(i) for i in range(n_rows)]
    bad = [(i, e) for i, e in enumerate(errors) if e is not None]
    if bad and strict:
        i, e = bad[0]
        raise ValueError(f"the {what} of the {i}th row read do not decode ({e})")


def decompress_into(frame, size: int) -> np.ndarray:
    """The ``size`` bytes of one zstd frame, decoded into this thread's scratch buffer (uint8, valid until the
    thread's next call): ValueError if the frame is damaged or holds another number of bytes.

    One buffer a thread, reused, instead of a fresh one a frame (pyarrow's ``Codec.decompress``): on the pool's two
    threads a pair's high bytes decoded at 5.2-5.4 GB/s of bf16 against 4.1-4.2 (``python
    bench/first_epoch_parts.py``, a 2-core Intel Xeon host), and the join of the planes reads a buffer that stays in
    the core's cache. A thread keeps the buffer of its largest row's high bytes as long as it lives (8 MiB for an
    8B teacher's 2,048 x 4,096 rows; the pool has up to 8 threads). zg's frames, level 3's and the fast strategy's
    (window 2**17), decode here; python-zstandard refuses windows over 2**27."""
    import zstandard

    d = getattr(_LOCAL, "dctx", None)
    if d is None:
        d = _LOCAL.dctx = zstandard.ZstdDecompressor()
    buf = getattr(_LOCAL, "scratch", None)
    if buf is None or buf.size < size:
        buf = _LOCAL.scratch = np.empty(size, dtype=np.uint8)
    view, got = memoryview(buf)[:size], 0
    try:
        reader = d.stream_reader(frame, read_across_frames=False)
        while got < size and (k := reader.readinto(view[got:])):
            got += k
        more = got == size and len(reader.read(1)) > 0
    except (zstandard.ZstdError, TypeError, BufferError) as e:  # a damaged frame, or a null row: no frame at all
        raise ValueError(str(e)) from e
    if got != size or more:
        raise ValueError(f"more than {size} bytes" if more else f"{got} bytes, not {size}")
    return buf[:size]


def decode_planes(bufs: list, lo, n: int, dtype, strict: bool, out) -> np.ndarray:
    """``codec.decode_rows`` of a byte split: each row's compressed high bytes (``bufs``) and its other bytes (``lo``),
    ``n`` values of numpy ``dtype`` (uint16 for bf16) a row."""
    nbytes = np.dtype(dtype).itemsize
    n_rows = len(lo)
    want = out
    if isinstance(out, list):  # rows that need not be next to each other (the cache's rows of several blocks)
        out16 = [o.view(np.uint16) for o in out] if nbytes == 2 else None
        out = [o.view(np.uint8).reshape(n, nbytes) for o in out]
    else:
        out = np.empty((n_rows, n, nbytes), np.uint8) if out is None else out.view(np.uint8).reshape(n_rows, n, nbytes)
        out16 = out.reshape(n_rows, n * nbytes).view(np.uint16) if nbytes == 2 else None

    def one(i: int) -> str | None:
        """Decode row i (its high bytes, then both planes into ``out``); an error text if they do not decode."""
        try:
            hi = decompress_into(bufs[i], n)
            err = None
        except _ERRORS as e:
            hi, err = np.zeros(n, dtype=np.uint8), str(e)
        join_planes(hi, lo[i], out16[i] if out16 is not None else out[i])  # per row in this thread: cache-sized
        return err

    _each_row(len(bufs), one, strict, "compressed high bytes")
    return want if want is not None else out.reshape(n_rows, n * nbytes).view(dtype)


def join_planes(hi: np.ndarray, lo_row: np.ndarray, out_row: np.ndarray) -> None:
    """One row's high bytes (n,) and other bytes into ``out_row``: (n,) uint16 for bf16, else (n, bytes) uint8."""
    if out_row.dtype == np.uint16:  # bf16: (hi << 8) | lo in two vectorized passes
        np.left_shift(hi, 8, out=out_row, dtype=np.uint16)
        np.bitwise_or(out_row, lo_row, out=out_row, dtype=np.uint16)
    else:
        out_row[:, :-1] = lo_row.reshape(len(hi), -1)
        out_row[:, -1] = hi


def decode_quantized(table, seq_len: int, hidden: int, strict: bool, out) -> np.ndarray:
    """(N, T*C) bf16 bits of a quantized table (``quant.dequantize`` of its columns, row by row on the pool)."""
    from zgdata.store.quant import dequantize

    t, c = seq_len, hidden
    scales = flat_values(table.column("hidden_scale"), t)
    n_rows = len(scales)
    idx = list_rows(table.column("hidden_oidx"), n_rows, t)
    val = list_rows(table.column("hidden_oval"), n_rows, t)
    bufs = row_buffers(table.column("hidden_q"))
    res = out if out is not None else np.empty((n_rows, t * c), dtype=np.uint16)

    def one(i: int) -> str | None:
        try:
            q = decompress_into(bufs[i], t * c).view(np.int8).reshape(1, t, c)
            err = None
        except _ERRORS as e:
            q, err = np.zeros((1, t, c), dtype=np.int8), str(e)
        dequantize(q, scales[i : i + 1], idx[i : i + 1], val[i : i + 1], out=res[i].reshape(1, t, c))
        return err

    _each_row(n_rows, one, strict, "compressed int values")
    return res


def row_buffers(col) -> list:
    """Each row of a binary column (array or chunked) as a zero-copy buffer (a compressed frame each)."""
    return [
        ch[j].as_buffer() for ch in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]) for j in range(len(ch))
    ]


def list_rows(col, n_rows: int, t: int) -> np.ndarray:
    """A list<uint16> column of T*k values per row as one (N, T, k) array."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if n_rows == 0:
        return np.zeros((0, t, 0), dtype=np.uint16)
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(n_rows, t, -1)


def flat_values(col, width: int) -> np.ndarray:
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

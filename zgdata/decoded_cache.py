"""Decode a compressed boundary's rows once per process: an in-memory cache of decoded rows.

A ``zstd`` boundary (zgdata/codec.py) decodes each row's high bytes with one zstd frame; on a
few cores that runs at a fraction of a raw memmap's speed (bench/materialize.py). Training reads
every row once per epoch, many epochs over, so the reader decodes a row the first time it is
asked for and later reads copy it out of this cache, at memory speed, like a raw boundary's
mapped pages sitting in the OS page cache.

Only the first read of a row decodes it; the bits are the decoded bits (the checksums check
them on that read, zgdata/reader.py), and the order of rows is the caller's: no bit and no
sample order changes. The cache is one array sized for the whole boundary, reserved lazily by
the OS (``np.empty`` touches no page until a row lands in it). A boundary bigger than
``ZG_DECODED_CACHE_MB`` (default: an eighth of the machine's memory, per boundary) is not cached
and decodes on every read, as before.
"""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["decoded_cache", "budget_bytes"]


def budget_bytes() -> int:
    """Largest decoded boundary that is cached: ``ZG_DECODED_CACHE_MB``, default 1/8 of physical memory."""
    env = os.environ.get("ZG_DECODED_CACHE_MB")
    if env is not None and env.strip():
        try:
            return max(0, int(float(env))) * 2**20
        except ValueError:
            return 0  # a malformed value turns the cache off rather than failing every read
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
    except (ValueError, OSError, AttributeError):
        return 0


def decoded_cache(n_rows: int, row_values: int, dtype, fetch):
    """rows (int64, any order) -> (N, row_values) array, each row decoded by ``fetch`` once; None if over budget.

    ``fetch(sorted unique rows)`` returns their decoded values (one sorted read of the missing rows)."""
    dtype = np.dtype(dtype)
    if n_rows == 0 or n_rows * row_values * dtype.itemsize > budget_bytes():
        return None
    cache = np.empty((n_rows, row_values), dtype)
    have = np.zeros(n_rows, dtype=bool)
    lock = threading.Lock()  # two threads asking for the same missing row decode it once

    def read(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if not have[rows].all():
            with lock:
                miss = np.unique(rows[~have[rows]])
                if len(miss):
                    cache[miss] = fetch(miss)
                    have[miss] = True  # only after the values are in place
        return cache[rows]

    return read

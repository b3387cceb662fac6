"""Decode a compressed boundary's rows once per process: an in-memory cache of decoded rows.

A ``zstd`` boundary (zgdata/store/codec.py) decodes each row's high bytes with one zstd frame; on a
few cores that runs at a fraction of a raw memmap's speed (bench/materialize.py). Training reads
every row once per epoch, many epochs over, so the reader decodes a row the first time it is
asked for and later reads copy it out of this cache, at memory speed, like a raw boundary's
mapped pages sitting in the OS page cache.

Only the first read of a row decodes it; the bits are the decoded bits (the checksums check
them on that read, zgdata/store/reader.py), and the order of rows is the caller's: no bit and no
sample order changes. The cache is one array sized for the whole boundary, reserved lazily by
the OS (no page is touched until a row lands in it), on 4 KiB pages (``small_pages``). All caches
of one process share one budget, ``ZG_DECODED_CACHE_MB`` (default: a sixteenth of the machine's
memory, so that N blocks trained at once by `zg repro --jobs N` stay bounded too); a boundary that
does not fit in what is left is not cached and decodes on every read.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

__all__ = ["decoded_cache", "budget_bytes"]


_reserved = 0  # bytes held by this process's live caches
_reserved_lock = threading.Lock()


def _after_fork() -> None:
    """A forked child gets a lock no thread of the parent can hold (a reader thread may hold it at the fork)."""
    global _reserved_lock
    _reserved_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def budget_bytes() -> int:
    """Bytes all decoded caches of this process may hold: ``ZG_DECODED_CACHE_MB``, default 1/16 of memory."""
    env = os.environ.get("ZG_DECODED_CACHE_MB")
    if env is not None and env.strip():
        try:
            return max(0, int(float(env))) * 2**20
        except ValueError:
            return 0  # a malformed value turns the cache off rather than failing every read
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 16
    except (ValueError, OSError, AttributeError):
        return 0


def small_pages(shape: tuple[int, int], dtype) -> np.ndarray:
    """An uninitialized array like ``np.empty``, in an anonymous map advised ``MADV_NOHUGEPAGE``.

    numpy advises ``MADV_HUGEPAGE`` for every array of 4 MB or more. The cache is written once, row by row, in the
    first epoch, so its cost there is the first write to fresh memory, and on a host that hands freed guest memory
    back lazily (the 2-core VMs this project is measured on) huge pages made that write the epoch's largest cost: a
    decode into fresh numpy memory ran at 0.52-0.55 GB/s (2.8-3.2 system core-s per GB) against 1.8-1.9 on small
    pages, and a fresh process's first epoch of a 512 MB ``zstd_fast`` pair at 0.46-0.70 GB/s against 1.02-1.08, warm
    epochs the same (``python bench/first_epoch_parts.py``, docs/results/write-path.md). Where the guest had backed the
    memory recently, huge pages' first write was the faster one (``python bench/write_path.py --loader-cold``
    prints it); a training process's cache is new memory of a new process: the smaller risk is taken.
    Elsewhere (no such advice on this OS) it is ``np.empty``."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < mmap.PAGESIZE or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(shape, dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_NOHUGEPAGE)
    except OSError:  # a kernel built without transparent huge pages refuses the advice: its pages are small anyway
        pass
    # the array is the map's one owner (its views point at it, not at a view of it): the map, and the cache's
    # share of the budget (weakref.finalize in decoded_cache), go with the last view
    return np.ndarray(shape, dtype, buffer=m)


READAHEAD_BYTES = 16 << 20  # decoded bytes a miss reads ahead: long sorted runs, not a few rows per Lance take


def decoded_cache(n_rows: int, row_values: int, dtype, fetch, fetch_into=None, threads: int = 1):
    """rows (int64, any order) -> (N, row_values) array, each row decoded by ``fetch`` once; None if over budget.

    ``fetch(sorted unique rows)`` returns their decoded values (one sorted read of the missing rows). A miss reads
    the whole aligned block of about ``READAHEAD_BYTES`` that holds it (rows ``[k * ahead, (k + 1) * ahead)``), one
    Lance take each: a first epoch in random order then reads the dataset in contiguous runs (a take of four
    scattered rows costs about as much as one of thirty contiguous ones, bench/write_path.py), each decoded straight
    into the cache. A read whose misses fall in several blocks decodes all of them before it returns (the work the
    epoch needs anyway, early). A block holding a row that does not decode is not read ahead again: its rows are
    then read as they are asked for, and the damaged one raises when it is. Every row is checked against its
    checksum when it is asked for (zgdata/store/reader.py).

    ``fetch_into(sorted rows, out)``, if given, decodes rows straight into the cache's own rows (``out``: a contiguous
    run's array, or a list of one array a row), as ``fetch`` would return them: no copy, and no fresh buffer per read
    (on this VM, memory touched for the first time is written at 0.2-0.7 GB/s, bench/write_path.py).

    ``threads``: the decoding threads ``fetch_into`` spreads a call's rows over. Where a block has fewer rows than
    that (an 8B teacher's 2048 x 4096 rows are 16 MB: a block is one row), a read that misses several blocks reads
    and decodes them together, as many blocks a call as give every thread a row, each row straight into its place;
    one block at a time, such rows decoded one after another on one core. If one of them does not decode, they are
    read block by block as above. Blocks of many rows are still read one at a time: reading several together cost
    a 576-wide pair's first epoch 15% (more fresh memory per Lance take). The reader gives each side of a pair half
    the decoding pool: on two cores that is one thread, and a pair's two sides already decode on both (with two
    threads a side, 16 MB rows: one side alone 0.90 GB/s against 0.65, the pair no faster, docs/results/write-path.md)."""
    global _reserved
    dtype = np.dtype(dtype)
    size = n_rows * row_values * dtype.itemsize
    with _reserved_lock:
        if n_rows == 0 or _reserved + size > budget_bytes():
            return None
        _reserved += size
    cache = small_pages((n_rows, row_values), dtype)
    weakref.finalize(cache, _release, size)  # the reservation lives as long as the array
    return _Cache(cache, fetch, fetch_into, threads)


class _Cache:
    """``decoded_cache``'s reader: called with rows, it returns their decoded values."""

    def __init__(self, cache: np.ndarray, fetch, fetch_into, threads: int):
        self.cache, self.fetch, self.fetch_into = cache, fetch, fetch_into
        self.n = len(cache)
        self.have = np.zeros(self.n, dtype=bool)
        self.lock = threading.Lock()  # two threads asking for the same missing row decode it once
        self.ahead = max(1, READAHEAD_BYTES // max(1, cache.strides[0]))
        self.together = -(-max(1, threads) // self.ahead)  # blocks a call: a row for every decoding thread
        self.failed: set[int] = set()  # blocks holding a row that did not decode: no more read-ahead there

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if not self.have[rows].all():
            with self.lock:
                miss = np.unique(rows[~self.have[rows]])
                ks = [k for k in np.unique(miss // self.ahead).tolist() if k not in self.failed]  # their blocks
                alone = []  # blocks to read one at a time: all of them, or a group of them that did not decode
                for i in range(0, len(ks), self.together):
                    alone += self._put_together(ks[i : i + self.together])
                for k in alone:
                    try:
                        self._put(self._block(k))  # a block is cached whole or not at all, outside ``failed``
                    except Exception:  # a row of it does not decode: its rows are read as asked for, below
                        self.failed.add(k)
                miss = miss[~self.have[miss]]
                for run in np.split(miss, np.flatnonzero(np.diff(miss) != 1) + 1) if len(miss) else []:
                    self._put(run)  # rows of failed blocks, each contiguous run into the cache; a damaged one raises
        return self.cache[rows]

    def _block(self, k: int) -> np.ndarray:
        return np.arange(k * self.ahead, min(self.n, (k + 1) * self.ahead))

    def _put(self, rows: np.ndarray) -> None:
        """Decode sorted unique ``rows`` into the cache (straight into it when they are one contiguous run)."""
        if self.fetch_into is not None and rows[-1] - rows[0] + 1 == len(rows):
            self.fetch_into(rows, self.cache[rows[0] : rows[-1] + 1])
        else:
            self.cache[rows] = self.fetch(rows)
        self.have[rows] = True  # only after the values are in place

    def _put_together(self, ks: list[int]) -> list[int]:
        """Blocks ``ks`` in one read and one decode, each row straight into its place in the cache: the decoding
        pool then has every row of them at once (one row a block, an 8B teacher's, would decode one at a time
        block after block); [] once they are in, else ``ks``, to be decoded block by block."""
        if len(ks) < 2 or self.fetch_into is None:  # one block, or none that decodes into place
            return ks
        run = np.concatenate([self._block(k) for k in ks])
        try:
            self.fetch_into(run, [self.cache[r] for r in run.tolist()])
        except Exception:  # one of them does not decode: block by block finds which, and reads the others
            return ks
        self.have[run] = True
        return []


def _release(size: int) -> None:
    global _reserved
    with _reserved_lock:
        _reserved -= size

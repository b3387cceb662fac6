"""zgdata/store/decoded_cache.py: each row decoded once, rows back in the caller's order, bounded by its budget (pure, fast)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from zgdata.store import decoded_cache as module
from zgdata.store.decoded_cache import decoded_cache

ROWS = np.arange(40 * 6, dtype=np.uint16).reshape(40, 6)


@pytest.fixture(autouse=True)
def _empty_process_budget(monkeypatch):
    """The budget is per process: caches that other tests of this xdist worker keep alive (module fixtures) would
    count against these tests' 1 MB. Start each test from an empty account; the real one is restored after."""
    monkeypatch.setattr(module, "_reserved", 0)


def _fetch(calls):
    def fetch(rows):
        calls.append(rows.copy())
        assert np.array_equal(rows, np.unique(rows))  # one sorted read of distinct rows
        return ROWS[rows]

    return fetch


def test_each_row_is_decoded_once_and_returned_in_the_callers_order(monkeypatch):
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    calls = []
    read = decoded_cache(40, 6, np.uint16, _fetch(calls))
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = rng.integers(0, 40, size=12)
        assert np.array_equal(read(rows), ROWS[rows])
    assert np.array_equal(read(np.arange(40)[::-1]), ROWS[::-1])
    fetched = np.concatenate(calls)
    assert np.array_equal(np.sort(fetched), np.arange(40))  # every row fetched exactly once
    n = len(calls)
    read(np.array([3, 3, 39, 0]))
    assert len(calls) == n  # all cached: no fetch


def test_threads_share_one_decode(monkeypatch):
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    calls = []
    read = decoded_cache(40, 6, np.uint16, _fetch(calls))
    out = [None] * 4
    ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, read(np.arange(40)))) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(np.array_equal(o, ROWS) for o in out)
    assert np.array_equal(np.sort(np.concatenate(calls)), np.arange(40))


def test_over_budget_or_off_is_no_cache(monkeypatch):
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "0")
    assert decoded_cache(40, 6, np.uint16, _fetch([])) is None
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    assert decoded_cache(2**20, 6, np.uint16, _fetch([])) is None  # 12 MB > 1 MB
    monkeypatch.delenv("ZG_DECODED_CACHE_MB")
    assert decoded_cache(40, 6, np.uint16, _fetch([])) is not None  # default: 1/16 of memory


def test_caches_of_one_process_share_one_budget(monkeypatch):
    """Two boundaries of 0.6 MB under a 1 MB budget: the second is not cached while the first lives."""
    import gc

    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    rows = 600_000 // (6 * 2)
    first = decoded_cache(rows, 6, np.uint16, _fetch([]))
    assert first is not None
    assert decoded_cache(rows, 6, np.uint16, _fetch([])) is None
    del first
    gc.collect()
    assert decoded_cache(rows, 6, np.uint16, _fetch([])) is not None  # released with the first cache


def test_contiguous_runs_decode_straight_into_the_cache(monkeypatch):
    """With ``fetch_into``, a read-ahead run (contiguous rows) is decoded into the cache's own rows; the values and
    the caller's order are the same, each row decoded once."""
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    monkeypatch.setattr(module, "READAHEAD_BYTES", 8 * 6 * 2)  # 8 rows ahead
    calls, into = [], []

    def fetch_into(rows, out):
        into.append(rows.copy())
        assert out.flags.c_contiguous and out.shape == (len(rows), 6)  # one thread: never several blocks a call
        out[...] = ROWS[rows]

    read = decoded_cache(40, 6, np.uint16, _fetch(calls), fetch_into=fetch_into)
    rng = np.random.default_rng(1)
    for _ in range(6):
        rows = rng.integers(0, 40, size=5)
        assert np.array_equal(read(rows), ROWS[rows])
    assert np.array_equal(read(np.arange(40)[::-1]), ROWS[::-1])
    assert into and all(np.array_equal(r, np.arange(r[0], r[-1] + 1)) for r in into)
    done = np.concatenate(calls + into)
    assert np.array_equal(np.sort(done), np.arange(40))  # every row decoded exactly once


def test_a_miss_reads_its_aligned_block_and_a_damaged_row_read_ahead_raises_only_when_asked(monkeypatch):
    """A miss decodes the whole aligned block of READAHEAD_BYTES that holds it, straight into the cache; a read that
    misses several blocks of fewer rows than there are decoding threads decodes them in one call. A block with a row that does not decode fails no read of its
    other rows nor of the blocks read with it, is not read ahead again (its rows are then read as asked, each run
    into the cache), and the damaged row raises when it is itself asked for."""
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    monkeypatch.setattr(module, "READAHEAD_BYTES", 8 * 6 * 2)  # blocks of 8 rows
    into, scattered = [], []

    def fetch_into(rows, out):
        into.append(rows.tolist())
        if 13 in rows:
            raise ValueError("row 13 does not decode")
        for o, r in zip(out, rows):  # a run's 2-D array or a list of rows: row by row either way
            o[...] = ROWS[r]

    read = decoded_cache(40, 6, np.uint16, _fetch(scattered), fetch_into=fetch_into, threads=16)
    assert np.array_equal(read(np.array([21, 3, 22])), ROWS[[21, 3, 22]])
    assert into == [[*range(0, 8), *range(16, 24)]]  # two blocks, one call: a row for each of the 16 threads
    assert np.array_equal(read(np.array([30, 9, 10])), ROWS[[30, 9, 10]])  # block 1 holds row 13: 9-10 alone
    assert into[1:] == [[*range(8, 16), *range(24, 32)], list(range(8, 16)), list(range(24, 32)), [9, 10]]
    with pytest.raises(ValueError, match="row 13"):
        read(np.array([13]))
    assert np.array_equal(read(np.array([14, 12, 11])), ROWS[[14, 12, 11]])
    assert into[5:] == [[13], [11, 12], [14]]  # the damaged block read ahead no more
    assert not scattered  # every read went straight into the cache
    assert np.array_equal(read(np.array([33, 39, 0, 31])), ROWS[[33, 39, 0, 31]])
    assert into[8:] == [list(range(32, 40))]


@pytest.mark.parametrize("threads, rows_a_call", [(1, 2), (2, 2), (3, 4), (16, 16), (64, 40)])
def test_a_read_missing_many_blocks_decodes_a_row_for_each_thread_a_call(monkeypatch, threads, rows_a_call):
    """Blocks of 2 rows: as many blocks a call as give each decoding thread a row (whole blocks, at least one)."""
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    monkeypatch.setattr(module, "READAHEAD_BYTES", 2 * 6 * 2)  # blocks of 2 rows: 20 blocks
    into = []

    def fetch_into(rows, out):
        into.append(rows.tolist())
        for o, r in zip(out, rows):
            o[...] = ROWS[r]

    read = decoded_cache(40, 6, np.uint16, _fetch([]), fetch_into=fetch_into, threads=threads)
    assert np.array_equal(read(np.arange(40)[::-1]), ROWS[::-1])
    assert into == [list(range(i, min(40, i + rows_a_call))) for i in range(0, 40, rows_a_call)]
    assert np.array_equal(read(np.arange(40)), ROWS) and len(into) == -(-40 // rows_a_call)  # cached: no more calls


def _vm_flags(address: int) -> list[str]:
    """The kernel's VmFlags of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside, lines = False, open("/proc/self/smaps").read().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(
    not hasattr(__import__("mmap"), "MADV_NOHUGEPAGE") or not __import__("os").path.exists("/proc/self/smaps"),
    reason="MADV_NOHUGEPAGE and /proc/self/smaps are Linux's",
)
def test_the_cache_lives_on_small_pages_and_holds_the_rows(monkeypatch):
    """numpy advises huge pages for large arrays; the cache's memory is advised against them (``nh``), since its
    first write is the first epoch's cost (small_pages' docstring has the measurement), and it still holds the rows."""
    big = module.small_pages((64, 1 << 16), np.uint16)  # 8 MiB: numpy would advise huge pages for np.empty
    assert big.flags.writeable and big.flags.c_contiguous and big.shape == (64, 1 << 16)
    assert "nh" in _vm_flags(big.ctypes.data)
    big[...] = 7
    assert int(big[-1, -1]) == 7

    rows = np.arange(40 * 1024, dtype=np.uint16).reshape(40, 1024)  # 80 KiB: a map, not np.empty's small path
    made, real = [], module.small_pages
    monkeypatch.setattr(module, "small_pages", lambda *a: made.append(real(*a)) or made[-1])  # records, then the real
    monkeypatch.setenv("ZG_DECODED_CACHE_MB", "1")
    read = decoded_cache(40, 1024, np.uint16, lambda r: rows[r])
    assert np.array_equal(read(np.arange(40)[::-1]), rows[::-1])
    assert len(made) == 1 and np.array_equal(made[0], rows)  # the rows live in the array small_pages made
    assert "nh" in _vm_flags(made[0].ctypes.data)

"""The read side of bench/write_path.py: the loader's first and warm epochs against np.memmap, the ceiling a
compressed first epoch meets (zstd alone on every core), verify of every row, and the trust check against a pull.
Not a test; ``python bench/write_path.py`` runs these on the boundary pairs it writes."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

B = 4  # rows per batch, materialize.batch_size's default
# the share of a pair's bytes still in the page cache after an eviction, at most, for "from the disk"
RESIDENT_MAX = 0.05


def _files(*roots: Path):
    for root in roots:
        for d, _, files in os.walk(root):
            yield from (os.path.join(d, f) for f in files)


def fsync_tree(root: Path, *, drop: bool = False) -> None:
    """fsync every file under ``root``; ``drop``: then drop its pages from the page cache (``POSIX_FADV_DONTNEED``:
    clean pages that no live map holds)."""
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_share(*roots: Path) -> float | None:
    """The share of the bytes of the files under ``roots`` that are in the page cache (``mincore`` of each file
    mapped, never touched); None where the C library has no mincore (not Linux)."""
    import ctypes
    import mmap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = (
            ctypes.c_void_p,
            [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long],
        )
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    total = resident = 0
    for path in _files(*roots):
        size = os.path.getsize(path)
        if not size:
            continue
        pages = -(-size // mmap.PAGESIZE)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            vec = ctypes.create_string_buffer(pages)
            try:
                if libc.mincore(addr, size, vec) != 0:
                    return None
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        resident += sum(b & 1 for b in vec.raw) * mmap.PAGESIZE
        total += pages * mmap.PAGESIZE
    return resident / total if total else 0.0


def evict(*roots: Path) -> float | None:
    """Drop every file under ``roots`` from the page cache, so that the next read comes from the disk, as every
    epoch of a boundary larger than memory does: the share of their bytes still resident afterwards (0 where it
    worked; about 1 on a tmpfs, or for pages a live map holds), None where the OS cannot tell or drop them."""
    if not hasattr(os, "posix_fadvise"):
        return None
    for root in roots:
        fsync_tree(root, drop=True)
    return resident_share(*roots)


def first_touch(nbytes: int) -> tuple[float, float]:
    """GB/s of writing ``nbytes`` of fresh memory, then of the same memory again (the VM's first-touch cost)."""
    t0 = time.perf_counter()
    a = np.empty(nbytes, np.uint8)
    a[:] = 1
    t1 = time.perf_counter()
    a[:] = 2
    t2 = time.perf_counter()
    del a
    return nbytes / (t1 - t0) / 1e9, nbytes / (t2 - t1) / 1e9


class MemmapSide:
    """A boundary's rows in a plain np.memmap (.npy) with the boundary's metadata: what BoundaryPair reads when
    handed it in place of a BoundaryDataset, so the same loader (prefetch thread, queue, both sides in parallel)
    runs over a memmap. Sorted rows, read with one fancy index, no checks: the fastest a memmap loader reads."""

    def __init__(self, side, mm: np.ndarray):
        self.side, self.mm = side, mm
        self.name, self.meta, self.seq_ids, self.path = side.name, side.meta, side.seq_ids, side.path

    def rows(self, split: str) -> np.ndarray:
        return self.side.rows(split)

    def take(self, rows) -> torch.Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        out = np.ascontiguousarray(self.mm[rows[order]])[np.argsort(order)] if len(rows) else self.mm[:0]
        return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)


def _memmaps(pair, scratch: Path, n: int) -> list[np.ndarray]:
    """The pair's two sides' rows written to ``x.npy`` / ``y.npy`` under ``scratch``, opened as read-only memmaps."""
    scratch.mkdir(exist_ok=True)
    for side, name in ((pair.input, "x"), (pair.output, "y")):
        arr = np.lib.format.open_memmap(scratch / f"{name}.npy", "w+", np.uint16, (n, side.row_bytes // 2))
        arr[:] = side.take(np.arange(n)).view(torch.int16).numpy().reshape(n, -1).view(np.uint16)
        arr.flush()
        del arr
    return _reopen(scratch)


def _reopen(scratch: Path) -> list[np.ndarray]:
    """The memmaps ``_memmaps`` wrote, opened again (read-only)."""
    return [np.load(scratch / f"{name}.npy", mmap_mode="r") for name in ("x", "y")]


def _memmap_pair(pair, arrays):
    """The same loader (``BoundaryPair``) over memmaps of the pair's two sides."""
    from zgdata.store.reader import BoundaryPair

    return BoundaryPair(*(MemmapSide(s, m) for s, m in zip((pair.input, pair.output), arrays)))


def loader(pub: dict, *, prefault: bool = True, from_disk: bool = False) -> dict:
    """GB/s of a BoundaryPair's batches: a fresh pair's first epoch, then a warm epoch; and np.memmap of the same
    rows, two ways: a bare loop that drops each batch at once (its destination stays in the CPU's cache), and the
    same BoundaryPair.batches loader over the memmaps (the consumer holds batches while more are read ahead).
    ``prefault``: write and free the decoded caches' size of fresh memory first, so that on a host that backs guest
    memory lazily the first epoch meets memory the guest has backed (its first-touch rate is returned either way).
    ``from_disk``: then all three again from the disk (``evict`` before each: ``memmap_disk_gbps``,
    ``memmap_loader_disk_gbps``, ``first_disk_gbps``), with the largest share of the files still resident after an
    eviction (``disk_resident``; the figures are from the disk only where it is about 0); absent where the OS
    cannot drop pages or tell."""
    import gc

    from zgdata.store.reader import BoundaryPair

    a, b = list(pub.values())[:2]
    pair = BoundaryPair(a, b)
    n = len(pair.input.seq_ids)
    steps = n // B
    nbytes = steps * B * pair.input.row_bytes * 2
    touched = first_touch(n * pair.input.row_bytes * 2 if prefault else 1 << 26)  # the caches' size, freed

    def epoch(p):
        t0 = time.perf_counter()
        for _ in p.batches("train", start_step=0, steps=steps, batch_size=B, seed=0):
            pass
        return nbytes / (time.perf_counter() - t0) / 1e9

    first = epoch(pair)
    warm = epoch(pair)
    scratch = a.parent.parent / f"memmap-{a.parent.name}"
    mms = _memmaps(pair, scratch, n)

    def memmap_epoch(arrays) -> float:
        t0 = time.perf_counter()
        for step in range(steps):
            rows = np.sort(pair.batch_rows("train", step, B, 0))
            for m in arrays:
                torch.from_numpy(np.ascontiguousarray(m[rows]))
        return nbytes / (time.perf_counter() - t0) / 1e9

    mm = memmap_epoch(mms)
    mm_pair = _memmap_pair(pair, mms)
    mm_loader = epoch(mm_pair)
    out = {
        "first_gbps": first,
        "warm_gbps": warm,
        "memmap_gbps": mm,
        "memmap_loader_gbps": mm_loader,
        "first_touch_gbps": touched[0],
    }
    if from_disk:  # nothing may keep a map of the files (a mapped page is not dropped): the sides and memmaps go
        pair = BoundaryPair(a, b)  # for batch_rows only: its sides map nothing until they read
        mm_pair = None
        mms.clear()
        gc.collect()
        left = [evict(a, b, scratch)]
        if left[0] is not None:
            out["memmap_disk_gbps"] = memmap_epoch(_reopen(scratch))
            left.append(evict(a, b, scratch))
            mm_pair = _memmap_pair(pair, _reopen(scratch))
            out["memmap_loader_disk_gbps"] = epoch(mm_pair)
            mm_pair = None
            gc.collect()
            left.append(evict(a, b, scratch))
            out["first_disk_gbps"] = epoch(BoundaryPair(a, b))
            out["disk_resident"] = max(left)
    return out


def disk_ratios(lo: dict) -> tuple[float, float]:
    """A ``loader(..., from_disk=True)`` result's first epoch from the disk / the bare memmap loop and / the memmap
    through the same loader, both from the disk; NaN where not measured or the files stayed in the page cache."""
    if "first_disk_gbps" not in lo or lo["disk_resident"] > RESIDENT_MAX:
        return float("nan"), float("nan")
    return lo["first_disk_gbps"] / lo["memmap_disk_gbps"], lo["first_disk_gbps"] / lo["memmap_loader_disk_gbps"]


def disk_line(lo: dict) -> str:
    """The from-the-disk figures of a ``loader(..., from_disk=True)`` result, as the benches print them."""
    if "first_disk_gbps" not in lo:
        return "  from the disk: not measured (this OS cannot drop pages from its page cache, or cannot tell)"
    where = (
        f"page cache dropped: {lo['disk_resident']:.1%} of the files left in it at most"
        if lo["disk_resident"] <= RESIDENT_MAX
        else f"NOT from the disk: {lo['disk_resident']:.0%} stayed in the page cache (a tmpfs?), no ratio"
    )
    bare, through = disk_ratios(lo)
    return (
        f"  from the disk ({where}): first epoch {lo['first_disk_gbps']:.2f} GB/s, np.memmap "
        f"{lo['memmap_disk_gbps']:.2f} (ratio {bare:.2f}), np.memmap through the same loader "
        f"{lo['memmap_loader_disk_gbps']:.2f} (ratio {through:.2f})"
    )


def decode_ceiling(pub: dict) -> float:
    """GB/s of decoded bf16 of zstd alone over the high-byte frame of every row of a compressed pair, on as many
    threads as cores: what a first epoch could reach if reading, joining the planes and checking cost nothing."""
    from concurrent.futures import ThreadPoolExecutor

    import lance

    from zgdata.core.runtime import cores
    from zgdata.store.blobs import blob_rows
    from zgdata.store.codec import codec_of, value_info
    from zgdata.store.decode import decompress_into, row_buffers
    from zgdata.store.lance_io import schema_meta

    frames, n = [], 0
    for p in list(pub.values())[:2]:
        ds = lance.dataset(str(p))
        meta = schema_meta(ds.schema)
        _, t, c = value_info(ds.schema, meta)
        n = t * c  # high bytes per row
        if codec_of(meta) == "zstd_blob":  # the frames from the sidecars, copied into memory as the others are
            frames += [np.array(f) for f in blob_rows(ds, p, "hidden_hi")(np.arange(ds.count_rows()))]
            continue
        frames += row_buffers(ds.to_table(columns=["hidden_hi"]).column("hidden_hi"))
    with ThreadPoolExecutor(cores()) as pool:
        best = 0.0
        for _ in range(2):
            t0 = time.perf_counter()
            list(pool.map(lambda f: decompress_into(f, n), frames))
            best = max(best, len(frames) * n * 2 / (time.perf_counter() - t0) / 1e9)
    return best


def verify_full(pub: dict) -> dict:
    """Every row's checksum as `zg data verify` checks it (``BoundaryDataset.scan``), the same through Lance's
    streaming scan (``integrity.scan_checksums``, what scan falls back to), and reading the same files."""
    from zgdata.store.integrity import scan_checksums
    from zgdata.store.reader import BoundaryDataset

    sizes = []

    def rate(check) -> float:
        sets = [BoundaryDataset(p) for p in pub.values()]
        sizes.append(sum(len(b.seq_ids) * b.row_bytes for b in sets))
        t0 = time.perf_counter()
        for b in sets:
            _, bad = check(b)
            assert not bad
        return sizes[-1] / (time.perf_counter() - t0) / 1e9

    scan = rate(lambda b: b.scan())
    lance = rate(
        lambda b: scan_checksums(
            b.ds,
            b.row_bytes,
            algo=b.checksum,
            columns=b.scan_columns,
            decode=lambda rb, r: b.decode(rb, r, strict=False),
        )
    )
    nbytes = sizes[-1]
    t0 = time.perf_counter()
    for p in pub.values():
        for f in sorted(p.rglob("*")):
            if f.is_file():
                with open(f, "rb", buffering=0) as fh:
                    while fh.read(8 << 20):
                        pass
    return {"scan_gbps": scan, "lance_scan_gbps": lance, "read_gbps": nbytes / (time.perf_counter() - t0) / 1e9}


def trust_check(work: Path, pub: dict) -> dict:
    """trust.verify of a boundary pair recorded in a dvc.lock, on 1 thread and on all cores; a copy as the pull."""
    import hashlib

    from zgdata.trust import dvc_lock

    root = work / "proj"
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    pair = list(pub.values())[:2]
    t0 = time.perf_counter()
    for p in pair:  # the "pull": the same bytes copied in from elsewhere on this disk
        shutil.copytree(p, root / "data" / p.name)
    fsync_tree(root / "data")
    pull = time.perf_counter() - t0
    outs = []
    for p in pair:  # the reference md5s, one file after another, as DVC would record them
        files = {
            f.relative_to(root / "data" / p.name).as_posix(): hashlib.md5(f.read_bytes()).hexdigest()
            for f in (root / "data" / p.name).rglob("*")
            if f.is_file()
        }
        entries = sorted(({"md5": m, "relpath": r} for r, m in files.items()), key=lambda e: e["relpath"])
        h = hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest()
        outs.append({"path": f"data/{p.name}", "md5": h + ".dir"})
    (root / "dvc.lock").write_text(json.dumps({"schema": "2.0", "stages": {"materialize": {"outs": outs}}}))
    nbytes = sum(f.stat().st_size for f in (root / "data").rglob("*") if f.is_file())
    times = {}
    real_cores = dvc_lock.cores
    try:
        for label, n in (("1", 1), ("all", real_cores())):
            best = None
            for _ in range(2):
                dvc_lock._MEMO.clear()
                (root / dvc_lock.STATE).unlink(missing_ok=True)
                dvc_lock.cores = lambda n=n: n
                t0 = time.perf_counter()
                c = dvc_lock.verify(*(root / "data" / p.name for p in pair))
                dt = time.perf_counter() - t0
                assert c.outputs == 2 and c.hashed > 0, c  # the md5s matched the reference: no error raised
                best = dt if best is None else min(best, dt)
            times[label] = best
    finally:
        dvc_lock.cores = real_cores
    return {"bytes": nbytes, "pull_s": pull, "check_1_s": times["1"], "check_all_s": times["all"]}

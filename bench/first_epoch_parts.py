"""Where a compressed boundary's first epoch goes, part by part, in user and system CPU-seconds per GB. Not a test.

    python bench/first_epoch_parts.py                   # numpy's default: huge pages for arrays of 4 MB or more
    python bench/first_epoch_parts.py --no-huge-pages   # 4 KiB pages for every array
    python bench/first_epoch_parts.py --seq-len 2048 --hidden 4096 --mb 1024   # an 8B teacher's rows
    python bench/first_epoch_parts.py --codec zstd_blob   # the default conversion's codec: frames from the sidecars

In one fresh process: write a `zstd_fast` (or ``--codec zstd_blob``) boundary pair of --mb MB of synthetic bf16 rows of --seq-len x --hidden
with the real write path (bench/write_path.py); time the pair's first and warm epochs through
``BoundaryPair.batches`` (first, so that no part has written and freed the memory the decoded caches then get) and
one boundary's first epoch alone (a fresh dataset object, random batches of 4: with an 8B teacher's 16 MB rows, a
decoded-cache block is one row, and this shows whether one side's rows decode on more than one core); then, on one
of its boundaries, Lance's take of the high-byte frames (16 MB blocks, as the decoded cache reads them; a
``zstd_blob`` boundary's frames are views of its mapped sidecars instead, copied here), zstd alone
on its frames on 1 and 2 threads (into a fresh buffer a frame, as pyarrow's Codec.decompress, and into the thread's
own buffer, ``decode.decompress_into``), the decode and join of the planes (zstd's pool) into memory written before
and into fresh memory (``decoded_cache.small_pages``: 4 KiB pages, what the cache uses; then numpy's allocation),
the row checksums, the copy out of batches of 4. System time is the kernel's: on a host that backs guest memory
lazily, the first write to fresh memory is most of it (docs/results/write-path.md).
"""

from __future__ import annotations

import argparse
import gc
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def timed(name: str, f, nbytes: int) -> None:
    (u0, s0), t0 = _cpu(), time.perf_counter()
    f()
    dt, (u1, s1) = time.perf_counter() - t0, _cpu()
    gb = nbytes / 1e9
    print(f"{name:44s} {gb / dt:6.2f} GB/s   user {(u1 - u0) / gb:.2f}  sys {(s1 - s0) / gb:.2f} core-s per GB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="MB of bf16 in the pair")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--seq-len", type=int, default=512, help="tokens a row (2048 x 4096: an 8B teacher's 16 MB rows)")
    ap.add_argument("--no-huge-pages", action="store_true", help="turn off numpy's madvise(MADV_HUGEPAGE)")
    ap.add_argument("--codec", choices=("zstd_fast", "zstd_blob"), default="zstd_fast", help="the pair's codec")
    args = ap.parse_args(argv)
    from write_path import no_huge_pages, synthetic, write_path  # bench/: this script's folder is on sys.path

    if args.no_huge_pages:
        no_huge_pages()
    import torch
    from write_path_reads import B

    from zgdata.store.codec import _zstd, decode_rows
    from zgdata.store.decode import decompress_into, row_buffers
    from zgdata.store.decoded_cache import small_pages
    from zgdata.store.integrity import mismatched_rows
    from zgdata.store.pagemap import page_reader
    from zgdata.store.reader import BoundaryDataset, BoundaryPair

    torch.set_num_threads(1)
    xs = synthetic(4, args.seq_len, args.hidden)
    work = Path(tempfile.mkdtemp(prefix="zg-first-epoch-"))
    try:
        n = max(2, (args.mb << 20) // (2 * xs[0].numel() * 2))
        pub = write_path(work, xs, boundaries=2, batches=n, codec=args.codec, threads=2, publish=True)["published"]
        a, b = list(pub.values())[:2]
        ds = BoundaryDataset(a)
        rows, width, row_bytes = len(ds.seq_ids), ds.seq_len * ds.hidden, ds.row_bytes
        nbytes = rows * row_bytes
        print(
            f"one boundary ({args.codec}): {rows} rows of {ds.seq_len} x {ds.hidden} bf16, {nbytes / 1e9:.2f} GB; huge pages "
            f"{'off' if args.no_huge_pages else 'on (numpy default)'}"
        )
        pair = BoundaryPair(a, b)
        steps = rows // B
        pair_bytes = steps * B * row_bytes * 2

        def epoch():
            for _ in pair.batches("train", start_step=0, steps=steps, batch_size=B, seed=0):
                pass

        timed("the pair's first epoch (a fresh BoundaryPair)", epoch, pair_bytes)
        timed("the pair's warm epoch", epoch, pair_bytes)
        order = np.random.default_rng(0).permutation(rows)
        pair = None  # its two caches' share of the budget goes back (a third cache could be over it: not cached)
        gc.collect()
        cached = []

        def side_epoch():  # one boundary alone, a fresh dataset object (a cache of its own), random batches of 4
            one = BoundaryDataset(a)
            for i in range(0, rows - B + 1, B):
                one.take(order[i : i + B])
            cached.append(one._pages is not None)

        timed("one boundary's first epoch alone", side_epoch, rows // B * B * row_bytes)
        if not cached[0]:
            print("  (that boundary was read without its decoded cache: over ZG_DECODED_CACHE_MB's budget)")
        ahead = max(1, (16 << 20) // row_bytes)
        blocks = [np.arange(k, min(rows, k + ahead)) for k in range(0, rows, ahead)]
        tables: list = []
        if args.codec == "zstd_blob":  # the frames: views of the mapped sidecars, copied as a take would
            hi_of, lo_of = ds._blob_planes()
            timed(
                "the high bytes from the mapped sidecars",
                lambda: tables.extend([np.array(f) for f in hi_of(r)] for r in blocks),
                nbytes,
            )
            frames = [f for t in tables for f in t]
        else:
            timed(
                "Lance take of the high bytes, 16 MB blocks",
                lambda: tables.extend(ds.ds.take(r, columns=["hidden_hi"]) for r in blocks),
                nbytes,
            )
            frames = [f for t in tables for f in row_buffers(t.column("hidden_hi"))]
        for threads in (1, 2):  # the high bytes alone: a fresh output buffer a frame, and the thread's own buffer
            with ThreadPoolExecutor(threads) as pool:
                for how, dec in (
                    ("fresh buffers", lambda f: _zstd().decompress(f, width, asbytes=False)),
                    ("into scratch", lambda f: decompress_into(f, width)),
                ):
                    timed(
                        f"zstd alone, {how}, {threads} thread(s)", lambda dec=dec: list(pool.map(dec, frames)), nbytes
                    )
        if args.codec == "zstd_blob":
            views = lo_of
        else:
            views = page_reader(ds.ds, ds.path, "hidden_lo", width, np.uint8, ds._lo_probe(width)).views

        def decode_into(out):
            for t, r in zip(tables, blocks):
                hi = hi_of(r) if args.codec == "zstd_blob" else None  # the reader's own views of the sidecars
                decode_rows(
                    t, args.codec, "bfloat16", ds.seq_len, ds.hidden, out=out[r[0] : r[-1] + 1], lo=views(r), hi=hi
                )

        touched = np.empty((rows, width), np.uint16)
        touched[...] = 1
        timed("decode + join into memory written before", lambda: decode_into(touched), nbytes)
        small = small_pages((rows, width), np.uint16)  # before np.empty's: no memory freed just before to reuse
        timed("decode + join into fresh memory, 4 KiB pages", lambda: decode_into(small), nbytes)
        timed(
            "decode + join into fresh memory (np.empty)",
            lambda: decode_into(np.empty((rows, width), np.uint16)),
            nbytes,
        )
        sums = ds._checksums(np.arange(rows))
        timed("row checksums", lambda: mismatched_rows(sums, touched, algo=ds.checksum), nbytes)

        def copy_out():  # each batch dropped before the next, as the training loop does
            for i in range(0, rows, B):
                touched[np.sort(order[i : i + B])]

        timed("copy out batches of 4", copy_out, nbytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

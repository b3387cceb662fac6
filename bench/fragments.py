"""Benchmark: Lance fragments, data files and versions per boundary as rows grow, and read throughput
before and after finalize's compaction. Not a test.

Drives materialize's own writer (``zgdata.materialize.writer.Writer``: commit groups streamed into one
data file per boundary per group, journaled) and finalize (``staging.finalize``: compact, publish as one
version) on synthetic bf16 rows, so no teacher runs. Two settings per size:

  old   commit_rows 32, as before commit groups: one Lance version and one file per 32 rows
        (the staged dataset, before finalize, is what zg used to publish)
  new   commit_rows 0, commit_mb / file_mb given below: size-based groups, then finalize

Read throughput: ``--batches`` random batches of 4 rows (sorted, as the loader reads them) with
Lance ``take`` on the staged (many fragments) and on the published (compacted) dataset, MB/s.

Usage:  python bench/fragments.py                       # rows 256 1024 4096 of 128 x 256 bf16 (64 KiB/row)
        python bench/fragments.py --rows 256 1024 --commit-mb 16 --file-mb 64
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from zgdata.config import MaterializeConfig
from zgdata.materialize.staging import Journal, boundary_schema, finalize
from zgdata.materialize.writer import Writer


def write(stage: Path, rows: int, seq_len: int, hidden: int, cfg: MaterializeConfig) -> Journal:
    meta = {
        "kind": "boundary",
        "name": "h00",
        "layer": 0,
        "fingerprint": "bench",
        "lineage": {},
        "seq_len": seq_len,
        "hidden": hidden,
        "rows": {"train": rows},
        "format_version": 2,
        "codec": {"name": cfg.codec},
        "complete": False,
    }
    schemas = {"h00": boundary_schema(meta, seq_len, hidden, "bfloat16", cfg.codec)}
    journal = Journal(stage / "journal.json")
    w = Writer(
        stage=stage,
        names=["h00"],
        schemas=schemas,
        journal=journal,
        cfg=cfg,
        total_rows=rows,
        seq_len=seq_len,
        hidden=hidden,
    )
    w.start()
    g = torch.Generator().manual_seed(0)
    for lo in range(0, rows, cfg.batch_size):
        r = np.arange(lo, min(lo + cfg.batch_size, rows))
        x = torch.randn(len(r), seq_len, hidden, generator=g).to(torch.bfloat16)
        w.q.put((r, ["train"] * len(r), {"h00": x}))
    w.q.put(None)
    w.join()
    if w.error:
        raise w.error
    return journal


def read_mbps(path: Path, rows: int, row_bytes: int, batches: int) -> float:
    import lance

    ds = lance.dataset(str(path))
    rng = np.random.default_rng(0)
    picks = [np.sort(rng.choice(rows, 4, replace=False)) for _ in range(batches)]
    ds.take(picks[0], columns=["hidden"])  # warm
    t = time.perf_counter()
    for p in picks:
        ds.take(p, columns=["hidden"])
    return batches * 4 * row_bytes / (time.perf_counter() - t) / 1e6


def count(path: Path) -> tuple[int, int, int]:
    import lance

    ds = lance.dataset(str(path))
    return len(ds.get_fragments()), len(list((path / "data").iterdir())), len(ds.versions())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--commit-mb", type=int, default=16)
    ap.add_argument("--file-mb", type=int, default=64)
    ap.add_argument("--batches", type=int, default=200)
    args = ap.parse_args(argv)
    row_bytes = args.seq_len * args.hidden * 2
    print(f"command: python bench/fragments.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"row = {args.seq_len} x {args.hidden} bf16 = {row_bytes // 1024} KiB; new: commit_mb {args.commit_mb}, "
        f"file_mb {args.file_mb}"
    )
    print(
        f"{'rows':>6} {'MB':>6} | {'old frags/files/versions':>24} | {'new staged f/f/v':>17} {'published f/f/v':>16} "
        f"| {'read MB/s old':>16} {'compacted':>10} {'ratio':>6}"
    )
    for rows in args.rows:
        tmp = Path(tempfile.mkdtemp(prefix="zgfrag-"))
        try:
            old = MaterializeConfig(batch_size=4, commit_rows=32)
            (tmp / "old").mkdir()
            write(tmp / "old", rows, args.seq_len, args.hidden, old)
            o = count(tmp / "old" / "h00.lance")
            new = MaterializeConfig(batch_size=4, commit_rows=0, commit_mb=args.commit_mb, file_mb=args.file_mb)
            (tmp / "new").mkdir()
            j = write(tmp / "new", rows, args.seq_len, args.hidden, new)
            s = count(tmp / "new" / "h00.lance")
            staged_read = read_mbps(tmp / "old" / "h00.lance", rows, row_bytes, args.batches)
            final = tmp / "final" / "h00.lance"
            final.parent.mkdir()
            finalize(tmp / "new", ["h00"], j, {"h00": final}, n_rows=rows, row_bytes=row_bytes, file_mb=args.file_mb)
            p = count(final)
            pub_read = read_mbps(final, rows, row_bytes, args.batches)
            print(
                f"{rows:6d} {rows * row_bytes / 2**20:6.0f} | {'/'.join(map(str, o)):>24} | {'/'.join(map(str, s)):>17} "
                f"{'/'.join(map(str, p)):>16} | {staged_read:16.0f} {pub_read:10.0f} {pub_read / staged_read:6.2f}",
                flush=True,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the write path with and without write-behind syncs (``materialize.write_behind_mb``), arms taking turns
in one process. Not a test.

    python bench/write_behind.py                                 # blob and raw, 0 / 8 / 16 / 32 MB, 4 rounds
    python bench/write_behind.py --codecs zstd_fast --arms 0,32 --rounds 6

Each round first writes the same bytes plainly (8 MiB chunks, then fsync: the disk's rate in that round), then runs
bench/write_path.py's ``write_path`` (2 encoding threads, the Lance streams, the commit, files fsynced at the end)
once per arm, the arms in turn and in reverse order every other round, so a drift of this shared machine meets
every arm alike. Printed per run: GB/s, the ratio to the round's plain write, CPU seconds per GB; at the end each
arm's median ratio. zgdata/materialize/write_behind.py says why the syncs help.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import write_path as W


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="blob,raw")
    ap.add_argument("--arms", default="0,8,16,32", help="write_behind_mb values (0: no syncs)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--mb", type=int, default=256, help="MB of bf16 per run (4 boundaries of 4 x 512 x 576)")
    ap.add_argument("--workdir", type=Path, help="scratch folder on the disk to measure (default: a temp dir)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    xs = W.synthetic(4, 512, 576)
    per_batch = 4 * xs[0].numel() * 2
    batches = max(2, (args.mb << 20) // per_batch)
    arms = [int(a) for a in args.arms.split(",")]
    work = Path(tempfile.mkdtemp(prefix="zg-write-behind-", dir=args.workdir))
    ratios: dict[tuple[str, int], list[float]] = {}
    base = W.MaterializeConfig
    try:
        for r in range(args.rounds):
            plain = batches * per_batch / W.plain_write(work / "plain.bin", batches * per_batch)[0] / 1e9
            for codec in args.codecs.split(","):
                for mb in arms if r % 2 == 0 else arms[::-1]:
                    W.MaterializeConfig = lambda mb=mb, **kw: base(**kw, write_behind_mb=mb)
                    out = W.write_path(work, xs, boundaries=4, batches=batches, codec=codec, threads=2, publish=False)
                    shutil.rmtree(out["stage"])
                    gbps = out["bytes"] / out["seconds"] / 1e9
                    ratios.setdefault((codec, mb), []).append(gbps / plain)
                    W.log(
                        f"round {r}  plain {plain:.2f} GB/s  {codec:<9} write_behind_mb {mb:>3}  {gbps:.2f} GB/s  "
                        f"{gbps / plain:.2f} of plain  {out['cpu_s'] / (out['bytes'] / 1e9):.2f} core-s per GB"
                    )
    finally:
        W.MaterializeConfig = base
        shutil.rmtree(work, ignore_errors=True)
    for (codec, mb), v in ratios.items():
        W.log(
            f"{codec:<9} write_behind_mb {mb:>3}: median {statistics.median(v):.2f} of plain  ({', '.join(f'{x:.2f}' for x in v)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

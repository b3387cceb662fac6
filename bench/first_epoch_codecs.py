"""The training loader's first epoch of a boundary pair per codec, the codecs taking turns in one process. Not a test.

    python bench/first_epoch_codecs.py                                  # zstd_fast, zstd_blob at SmolLM2's rows
    python bench/first_epoch_codecs.py --seq-len 2048 --hidden 4096 --mb 1024   # an 8B teacher's 16 MB rows

Each codec's pair (2 boundaries of synthetic bf16 rows, ``--mb`` MB each) is written through the real write path
and published, then read by bench/write_path_reads.py's ``loader`` (a fresh BoundaryPair's first epoch, its warm
epoch, and a bare np.memmap loop over the same rows), ``--rounds`` times, the codecs' order alternating. Printed per
codec: each round's first-epoch GB/s and its ratio to the memmap loop of the same round.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
import write_path as W
import write_path_reads as R


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="zstd_fast,zstd_blob")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--mb", type=int, default=512, help="MB of bf16 per boundary of each pair")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # as bench/write_path.py: the cores are the reader's
    codecs = a.codecs.split(",")
    work = Path(tempfile.mkdtemp(prefix="zg-first-epoch-"))
    try:
        xs = W.synthetic(4, a.seq_len, a.hidden)
        batches = max(2, (a.mb << 20) // (xs[0].numel() * 2))
        pubs = {
            c: W.write_path(work, xs, boundaries=2, batches=batches, codec=c, threads=2, publish=True)["published"]
            for c in codecs
        }
        res: dict[str, list] = {c: [] for c in codecs}
        for r in range(a.rounds):
            for c in codecs if r % 2 == 0 else codecs[::-1]:
                out = R.loader(pubs[c])
                res[c].append((out["first_gbps"], out["first_gbps"] / out["memmap_gbps"]))
        for c, v in res.items():
            runs = ", ".join(f"{g:.2f} GB/s ({q:.2f})" for g, q in v)
            print(f"{c:10s} first epoch, rounds (of the memmap loop): {runs}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

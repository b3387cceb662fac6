"""A/B of the loader between two checkouts of zg, interleaved on one machine. Not a test.

    git worktree add /tmp/zg-old <commit>
    python bench/loader_ab.py /tmp/zg-old . --codecs raw,zstd_fast --rounds 2

For each round, each checkout and each codec, a fresh process writes a boundary pair of --mb MB of synthetic bf16
rows with that checkout's write path (bench/write_path.py) and reads it with that checkout's bench loader
(``write_path_reads.loader``: a fresh ``BoundaryPair``'s first epoch and a warm one), best of three. The checkouts
alternate, so both meet the same machine (these are shared and noisy: compare within one run only).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, tempfile, shutil
repo, codec, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [repo, repo + "/bench"]
from pathlib import Path
import torch
torch.set_num_threads(1)
from write_path import synthetic, write_path
from write_path_reads import loader
import zgdata
assert zgdata.__file__.startswith(repo), zgdata.__file__
work = Path(tempfile.mkdtemp(prefix="zg-loader-ab-"))
try:
    xs = synthetic(4, 512, 576)
    n = max(2, (mb << 20) // (2 * xs[0].numel() * 2))
    pub = write_path(work, xs, boundaries=2, batches=n, codec=codec, threads=2, publish=True)["published"]
    runs = [loader(pub) for _ in range(3)]  # that checkout's own loader figures: a fresh pair each
    print(f"{max(r['first_gbps'] for r in runs):.2f} {max(r['warm_gbps'] for r in runs):.2f}")
finally:
    shutil.rmtree(work, ignore_errors=True)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="checkout A (e.g. a git worktree of the older commit)")
    ap.add_argument("b", type=Path, help="checkout B")
    ap.add_argument("--codecs", default="raw,zstd_fast")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mb", type=int, default=512, help="MB of bf16 in the pair")
    args = ap.parse_args(argv)
    for r in range(args.rounds):
        for repo in (args.a, args.b):
            for codec in args.codecs.split(","):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(repo.resolve()), codec, str(args.mb)],
                    capture_output=True,
                    text=True,
                    env={"RUST_LOG": "error", **os.environ},
                )
                if out.returncode:
                    print(out.stderr[-2000:], file=sys.stderr)
                    return out.returncode
                first, warm = out.stdout.split()[-2:]
                print(f"round {r + 1}  {str(repo):<28} {codec:<10} first epoch {first} GB/s, warm {warm} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

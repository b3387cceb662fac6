"""One LM head's loss + backward at the `local` profile's size: F.cross_entropy against zgtrain/local/linear_ce.py.

    python bench/local_heads.py [--tokens 2040] [--hidden 256] [--vocab 49152] [--threads 2] [--repeats 5]

Side by side in one process, alternating (A B C A B C ...) after one warm-up each: the loss of
(tokens x hidden) activations through a (vocab x hidden) head and the gradients of both, as
``F.cross_entropy(z @ W.T)`` in fp32, as ``linear_ce`` in fp32 and as ``linear_ce`` with bf16 matmuls
(`local.precision: bf16`). Prints the median seconds of each and the ratios to the first. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from zgtrain.local.linear_ce import linear_ce


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2040, help="8 sequences x 255 predicted positions")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(args.tokens, args.hidden, generator=g).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    arms = {
        "F.cross_entropy fp32": lambda: F.cross_entropy(z @ w.T, y),
        "linear_ce fp32": lambda: linear_ce(z, w, y),
        "linear_ce bf16": lambda: linear_ce(z, w, y, dtype=torch.bfloat16),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(args.repeats + 1):
        for name, f in arms.items():
            z.grad = w.grad = None
            t0 = time.perf_counter()
            f().backward()
            if i:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    first = next(iter(med.values()))
    print(
        f"{args.tokens} tokens x hidden {args.hidden} x vocab {args.vocab}, {args.threads} threads, "
        f"median of {args.repeats}"
    )
    for name, s in med.items():
        print(f"  {name:22s} {s:7.3f} s   {first / s:5.2f}x")


if __name__ == "__main__":
    main()

"""The sample stage's top-p filter (zgdata/tokens/nucleus.py) against transformers' TopPLogitsWarper, per step.

    python bench/nucleus.py [--rows 64] [--vocab 49152] [--top-p 0.95] [--repeats 20] [--threads 2]

Not a test; prints, in one run, the median milliseconds of one step (a batch of --rows logits rows of --vocab
values, as the default sample stage filters at every new token: 64 rows of SmolLM2's vocabulary), each arm's
parts (the warper's `torch.sort` of values and indices; the filter's numpy sort of the values alone), and the
filter's speedup. The arms take turns repeat by repeat on the same logits, and every repeat checks that both give
the same bits. Also times `torch.multinomial` on the filtered probabilities: the draw `generate` makes next, left
as it is (its exponential noise over every logit is what fixes the draw's bits). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from zgdata.tokens.nucleus import NucleusFilter


def _ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64, help="rows of logits per step (the sample's batch_size)")
    ap.add_argument("--vocab", type=int, default=49152, help="logits per row (SmolLM2: 49,152)")
    ap.add_argument("--top-p", type=float, default=0.95, help="corpus.sample.top_p (default profile: 0.95)")
    ap.add_argument("--repeats", type=int, default=20, help="timed steps per arm")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (corpus.sample.threads)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x = torch.randn(a.rows, a.vocab, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.zeros(a.rows, 1, dtype=torch.long)
    warper, nucleus = TopPLogitsWarper(a.top_p), NucleusFilter(a.top_p)
    probs = warper(ids, x).softmax(-1)
    arms = {
        "warper": lambda: warper(ids, x),
        "nucleus": lambda: nucleus(ids, x),
        "torch_sort": lambda: torch.sort(x),
        "np_sort_values": lambda: np.sort(x.numpy(), axis=-1),
        "multinomial": lambda: torch.multinomial(probs, 1),
    }
    times = {k: [] for k in arms}
    for _ in range(a.repeats + 1):  # the first round warms up
        for k, fn in arms.items():
            times[k].append(_ms(fn))
        w, n = warper(ids, x), nucleus(ids, x)
        if not torch.equal(w.view(torch.int32), n.view(torch.int32)):
            raise SystemExit("the filter's bits differ from the warper's: a bug in zgdata/tokens/nucleus.py")
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:18s} {v:8.1f} ms per step")
    speedup = med["warper"] / med["nucleus"]
    print(f"filter speedup over the warper: {speedup:.2f}x (same bits in all {a.repeats + 1} steps)")
    res = {k: round(v, 2) for k, v in med.items()}
    print(json.dumps({"rows": a.rows, "vocab": a.vocab, "top_p": a.top_p, "ms": res, "speedup": round(speedup, 2)}))


if __name__ == "__main__":
    main()

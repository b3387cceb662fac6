"""zgdata/core/host_copy.py on a GPU: its copies under forced races, and what their overlap with the compute buys
(bench/gpu_check.py's `copies` check; the CPU runs it as a smoke test, where there is nothing to race or overlap).

    ZG_DEVICE=cuda python bench/host_copies.py            # 8B-sized batches; one JSON object; exit 1 if a copy differs
    python bench/host_copies.py --smoke                   # CPU, seconds

Races. On a tiny project the copies take microseconds and every training step waits for its loss, so the bitwise
checks of materialize (verify) and training (cached_online) would likely pass even with a wait missing. Here each
copy is queued behind a GPU sleep of some 50 ms:
  to_host    the forward's stream sleeps, then makes the boundary: the side stream must wait for it before copying
  to_device  the copy's own stream sleeps first: the training stream must wait for the copy before reading
  kept       the training stream sleeps, then reads the batch, which is then dropped, and the next batch is copied:
             without record_stream, the next copy could reuse the batch's memory before the read ran

Overlap, with synthetic batches at an 8B teacher's sizes (bf16 matmuls of width 4,096 stand for the compute, their
count calibrated so that one batch computes about 6.6x as long as its synchronous copy takes, as a 330 ms forward
against a 50 ms copy of 576 MB):
  materialize  forward + synchronous `.cpu()` per batch, against forward + `to_host` in `one_ahead`, against the
               forwards alone (`*_vs_compute`: 1.0 is a copy fully hidden)
  training     `x.to(dev)` per step from pageable memory, against `BoundaryPair.batches(device=)`'s loading thread
               (the reader's own method, fed in-memory batches), each step then computing and waiting for its loss
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

SPIN_CYCLES = 10**8  # torch.cuda._sleep: about 50-70 ms at a GPU's 1.4-2 GHz


def _sleep(stream=None) -> None:
    if stream is None:
        torch.cuda._sleep(SPIN_CYCLES)
        return
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SPIN_CYCLES)


def run(dev: torch.device) -> dict:
    """{'to_host': bool, 'to_device': bool, 'kept': bool}: each copy's bits equal its source's."""
    from zgdata.core import host_copy

    cuda = dev.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(4, 2048, 1024, generator=gen).to(torch.bfloat16)  # 16 MB, as one boundary of 4 x 2,048 x 1,024
    other = torch.randn(4, 2048, 1024, generator=gen).to(torch.bfloat16)
    bits = lambda t: t.cpu().view(torch.int16)  # noqa: E731
    out = {}

    on_dev = src.to(dev)
    if cuda:
        torch.cuda.synchronize(dev)
        _sleep()
    y = on_dev * 1  # queued behind the sleep on the forward's stream
    out["to_host"] = torch.equal(host_copy.to_host({0: y}).wait()[0].view(torch.int16), src.view(torch.int16))

    if cuda:
        _sleep(host_copy._copy_stream(dev, "to_device"))
    (x,) = host_copy.to_device((src,), dev).ready()
    out["to_device"] = torch.equal(bits(x.to(dev)), src.view(torch.int16))

    (x,) = host_copy.to_device((src,), dev).ready()
    if cuda:
        torch.cuda.synchronize(dev)
        _sleep()
    z = x.to(dev) * 1  # queued behind the sleep on the training stream
    del x
    (w,) = host_copy.to_device((other,), dev).ready()
    out["kept"] = torch.equal(bits(z), src.view(torch.int16)) and torch.equal(bits(w.to(dev)), other.view(torch.int16))
    return out


WIDTH = 4096
# The CPU smoke run's sizes: it exercises the code, nothing overlaps there. Width 256, not 4,096: a CPU without
# bf16 instructions (AMD family 23) took 132 s for one bf16 matmul of 512 x 4,096 x 4,096, so the smoke run at the
# 8B width ran past gpu_check's 10 minutes there; at 256 one takes milliseconds.
SMOKE = dict(mb=0.25, train_mb=0.25, batches=3, width=256)


def _timed(dev, fn) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = time.perf_counter()
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t


def best(dev, fn, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``, the device synchronized around each."""
    return min(_timed(dev, fn) for _ in range(repeats))


class _InMemory:
    """What ``BoundaryPair.batches`` reads through (``batch_rows``, ``take``), from batches already in memory."""

    def __init__(self, xs: list):
        self.xs = xs

    def batch_rows(self, split, step, batch_size, seed):
        return np.array([step])

    def take(self, rows):
        return self.xs[int(rows[0]) % len(self.xs)]


def overlap(dev: torch.device, *, mb: float, train_mb: float, batches: int, width: int = WIDTH) -> dict:
    """Seconds of each loop over ``batches`` batches (materialize: ``mb`` MB of bf16 a batch; training: ``train_mb``
    MB for the input and as much for the target; rows of ``width``), and their ratios."""
    from zgdata.core import host_copy
    from zgdata.core.host_copy import one_ahead, to_host
    from zgdata.store.reader import BoundaryPair

    rows = max(1, int(mb * 2**20) // (2 * width))
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(width, width, generator=gen) / width**0.5).to(torch.bfloat16).to(dev)
    h0 = torch.randn(rows, width, generator=gen).to(torch.bfloat16).to(dev)
    copy_s = best(dev, lambda: h0.cpu())
    mm_s = best(dev, lambda: h0 @ w)
    reps = max(1, round(6.6 * copy_s / mm_s))

    def forward():
        h = h0
        for _ in range(reps):
            h = h @ w
        return h

    def sync_loop():
        for _ in range(batches):
            forward().cpu()

    def overlap_loop():
        for _ in one_ahead(range(batches), lambda i: to_host({0: forward()})):
            pass

    res = {"rows": rows, "matmuls_per_batch": reps, "copy_s": copy_s}
    res["compute_s"] = best(dev, lambda: [forward() for _ in range(batches)])
    res["materialize_sync_s"] = best(dev, sync_loop)
    res["materialize_overlap_s"] = best(dev, overlap_loop)

    t_rows = max(1, int(train_mb * 2**20) // (2 * width))
    # two (input, target) pairs in pageable memory, as the reader's batches are
    xs = [tuple(torch.randn(t_rows, width, generator=gen).to(torch.bfloat16) for _ in "xy") for _ in range(2)]
    pair_copy_s = best(dev, lambda: [t.to(dev) for t in xs[0]])
    step_mm_s = best(dev, lambda: xs[0][0].to(dev) @ w) - pair_copy_s / 2
    # a step about 9.4x its batch's copy: 234 ms against 25 ms for an 8B block's 8 x 2,048 tokens
    t_reps = max(1, round(9.4 * pair_copy_s / max(step_mm_s, 1e-9)))
    res.update(train_rows=t_rows, matmuls_per_step=t_reps, pair_copy_s=pair_copy_s)

    def step(x, y):
        h, target = x.to(dev), y.to(dev)
        for _ in range(t_reps):
            h = h @ w
        return float((h - target)[0, 0])  # each step waits for its loss

    def train_sync():
        for i in range(batches):
            step(*xs[i % 2])

    def train_overlap():
        src = _InMemory(xs)
        for _, _, x, y in BoundaryPair.batches(
            src, "train", start_step=0, steps=batches, batch_size=1, seed=0, device=dev
        ):
            step(x, y)

    res["training_sync_s"] = best(dev, train_sync)
    # a training run gives its pinned batches back once, at its end (host_copy.release); here that would make every
    # timed round page-lock its batches afresh (cudaHostAlloc, tens of ms each), so the rounds keep them
    release, host_copy.release = host_copy.release, lambda device=None: None
    try:
        res["training_overlap_s"] = best(dev, train_overlap)
    finally:
        host_copy.release = release
    release(dev)
    res["materialize_overlap_speedup"] = res["materialize_sync_s"] / res["materialize_overlap_s"]
    res["materialize_overlap_vs_compute"] = res["compute_s"] / res["materialize_overlap_s"]
    res["materialize_sync_vs_compute"] = res["compute_s"] / res["materialize_sync_s"]
    res["training_overlap_speedup"] = res["training_sync_s"] / res["training_overlap_s"]
    return res


def main(argv=None) -> int:
    from zgdata.core.runtime import device, prefer_gpu

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=576, help="MB of bf16 a batch (576: 9 boundaries of an 8B teacher)")
    ap.add_argument(
        "--train-mb", type=int, default=134, help="MB of bf16 a training batch's input (134: 8 x 2,048 tokens of 8B)"
    )
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="the CPU smoke run: 3 batches of 0.25 MB, width 256")
    args = ap.parse_args(argv)
    prefer_gpu()
    dev = device()
    races = run(dev)
    res = {"device": str(dev), **races}
    res.update(
        overlap(dev, **(SMOKE if args.smoke else dict(mb=args.mb, train_mb=args.train_mb, batches=args.batches)))
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 0 if all(races.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

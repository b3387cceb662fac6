"""The encoding pool's changes (the fifth pass's two, the frames column, the stats' chunks of 2026-12-07 and their
TorchScript loop), each against what it replaced, the arms alternating in one process. Not a test.

    python bench/encode_pool.py                        # raw and zstd_fast, 1 and 2 encoding threads, 4 rounds
    python bench/encode_pool.py --codecs raw --rounds 6

Each encoding job takes the boundary stats with torch (a float32 copy, square, mean and sqrt per token, and the
absmax: zgdata/materialize/stats.py) and, for the compressed codecs, runs zstd; every job computes the row
checksums. Arms:

  before     the pool's threads take torch's process-wide thread count, so every op on a large tensor opens an
             OpenMP team of ``torch.get_num_threads()`` threads from each encoding thread; each row is copied into
             a fresh float32 tensor
  omp        each encoding thread limits its own OpenMP count to one (``runtime.serial_torch_thread``); fresh
             float32 copies
  pyframes   the OpenMP limit and a reused float32 buffer of a whole row, and the compressed frames made into their
             Arrow column by pyarrow's conversion of Python objects, which holds the GIL (``pa.array(frames)``)
  rows       the frames' column built by numpy copies that let go of the GIL (``codec.frames_array``); the stats
             still copy each whole row into the reused buffer and take absmax with ``torch.aminmax``
  eager      the stats as materialize takes them (float32 chunks that stay in cache: a whole row up to
             ``stats.ROW_BYTES``, else ``stats.CHUNK_BYTES``; a bf16 batch's absmax from the chunks' largest
             squares), but the chunk loop runs as Python: four torch calls a chunk, each giving up the GIL and taking
             it back (until 0a57c8f this arm did not exist, and until b29f139 both it and ``now`` took absmax by
             ``torch.aminmax``)
  now        what materialize does: the same, the loop compiled by TorchScript (``stats._kernel``): one call a batch
             that holds no GIL, the same bits

The pool runs the synthetic batches of bench/write_path.py (4 x 512 x 576 bf16, 4 boundaries, 40 batches, no I/O).
Printed per arm: the best GB/s of bf16 input over the rounds, the median CPU seconds per GB (the process's, every
thread's) and the median minor page faults per GB (fresh pages the process touched); then each arm's two-thread
speedup per round (2 threads / 1 thread, in the same round) and its median.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import threading

import pyarrow as pa
import torch
from write_path import pool_rate, synthetic

from zgdata.materialize import encode, stats
from zgdata.store import codec as codec_module

BATCHES, BOUNDARIES = 40, 4
ARMS = ("before", "omp", "pyframes", "rows", "eager", "now")
_ROW = threading.local()


def row_stats(x: torch.Tensor, fresh: bool = False) -> dict:
    """``stats.batch_stats`` before the chunks, for finite batches: each whole row copied into a float32 buffer of
    the thread's (a fresh tensor per row when ``fresh``), squared, its tokens' means; absmax by ``torch.aminmax``."""

    def buffer(shape):
        if fresh or getattr(_ROW, "buf", None) is None or _ROW.buf.shape != shape:
            _ROW.buf = torch.empty(shape, dtype=torch.float32)
        return _ROW.buf

    rms = torch.cat([b.mul_(b).mean(-1).sqrt_().reshape(-1) for b in (buffer(r.shape).copy_(r) for r in x)]).numpy()
    lo, hi = torch.aminmax(x)
    return {"rms_units": stats._units(rms), "tokens": int(rms.size), "absmax": max(abs(float(lo)), abs(float(hi)))}


def usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def arm(xs, codec: str, threads: int, name: str, batches: int) -> tuple[float, float, float]:
    """(GB/s, core-s per GB, minor faults per GB) of the pool in arm ``name``."""
    limit, batch_stats, frames = encode.serial_torch_thread, stats.batch_stats, codec_module.frames_array
    kernel = stats._kernel()
    if name in ("before", "omp", "pyframes"):
        codec_module.frames_array = lambda f: pa.array(f, type=pa.large_binary())  # pyarrow's conversion
    if name == "before":
        encode.serial_torch_thread = lambda: None  # the pool's threads take torch's process-wide count
    if name not in ("eager", "now"):  # whole rows, a fresh copy of each before the fifth pass
        stats.batch_stats = lambda x: row_stats(x, fresh=name in ("before", "omp"))
    if name == "eager":
        stats._KERNEL[:] = [(stats._rms_chunks, contextlib.nullcontext)]  # the chunk loop as Python
    try:
        (c0, f0) = usage()
        gbps = pool_rate(xs, codec, threads, batches, BOUNDARIES)
        (c1, f1) = usage()
        gb = batches * BOUNDARIES * xs[0].numel() * 2 / 1e9
        return gbps, (c1 - c0) / gb, (f1 - f0) / gb
    finally:
        encode.serial_torch_thread, stats.batch_stats, codec_module.frames_array = limit, batch_stats, frames
        stats._KERNEL[:] = [kernel]  # (the compiled loop, its context)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="raw,zstd_fast")
    ap.add_argument("--threads", default="1,2", help="encoding-thread counts")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"which arms to run, of {', '.join(ARMS)}")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=576, help="576 SmolLM2-135M, 4096 an 8B teacher")
    ap.add_argument("--batches", type=int, default=BATCHES, help="batches of 4 rows per arm and round")
    a = ap.parse_args(argv)
    arms = [n for n in ARMS if n in a.arms.split(",")]
    xs = synthetic(8 if a.seq_len * a.hidden <= 1 << 20 else 2, a.seq_len, a.hidden)
    print(f"torch's process-wide thread count: {torch.get_num_threads()}", flush=True)
    res: dict[tuple, list] = {}
    for r in range(a.rounds):
        for codec in a.codecs.split(","):
            for threads in map(int, a.threads.split(",")):
                for name in arms if r % 2 else arms[::-1]:
                    res.setdefault((codec, threads, ARMS.index(name)), []).append(
                        arm(xs, codec, threads, name, a.batches)
                    )
    for (codec, threads, i), v in sorted(res.items()):
        print(
            f"{codec:10s} {threads} thread(s)  {ARMS[i]:6s}  {max(g for g, _, _ in v):.2f} GB/s  "
            f"{statistics.median(c for _, c, _ in v):.2f} core-s per GB  "
            f"{statistics.median(f for _, _, f in v) / 1e3:.1f}k faults per GB  (rounds, GB/s/core-s: "
            + ", ".join(f"{g:.2f}/{c:.2f}" for g, c, _ in v)
            + ")",
            flush=True,
        )
    ts = sorted(map(int, a.threads.split(",")))
    for codec in a.codecs.split(","):
        for i, name in enumerate(ARMS):
            if len(ts) < 2 or name not in arms:
                continue
            lo, hi = res[(codec, ts[0], i)], res[(codec, ts[-1], i)]
            ups = [h[0] / low[0] for low, h in zip(lo, hi)]
            print(
                f"{codec:10s} {name:8s} {ts[-1]} threads / {ts[0]}: median {statistics.median(ups):.2f} "
                f"(rounds: {', '.join(f'{u:.2f}' for u in ups)})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

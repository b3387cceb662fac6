"""The encoding pool with one OpenMP thread per encoding thread (``runtime.serial_torch_thread``, what
materialize does) against torch's process-wide count (what it did before), alternating in one process. Not a test.

    python bench/encode_omp.py                        # raw and zstd_fast, 1 and 2 encoding threads, 4 rounds
    python bench/encode_omp.py --codecs raw --rounds 6

Each encoding job runs torch ops (the boundary stats: a float32 copy, square, mean, sqrt per row) and, for the
compressed codecs, zstd and the row checksum. Without the limit, every op on a large tensor opens an OpenMP team
of ``torch.get_num_threads()`` threads from each encoding thread. The pool runs the bench's synthetic batches
(bench/write_path.py: 4 x 512 x 576 bf16, 4 boundaries, 40 batches, no I/O); printed per arm: the best GB/s of
bf16 input over the rounds and the median CPU seconds per GB (the process's, every thread's). The arms take turns
within each round, so a drift of the shared machine meets both.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from write_path import cpu_s, pool_rate, synthetic

from zgdata.materialize import encode

BATCHES, BOUNDARIES = 40, 4


def arm(xs, codec: str, threads: int, limited: bool) -> tuple[float, float]:
    """(GB/s, core-s per GB) of the pool, with or without each encoding thread's OpenMP limit."""
    real = encode.serial_torch_thread
    if not limited:
        encode.serial_torch_thread = lambda: None  # the pool's threads take torch's process-wide count
    try:
        c0 = cpu_s()
        gbps = pool_rate(xs, codec, threads, BATCHES, BOUNDARIES)
        gb = BATCHES * BOUNDARIES * xs[0].numel() * 2 / 1e9
        return gbps, (cpu_s() - c0) / gb
    finally:
        encode.serial_torch_thread = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="raw,zstd_fast")
    ap.add_argument("--threads", default="1,2", help="encoding-thread counts")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args(argv)
    xs = synthetic(8, 512, 576)
    print(f"torch's process-wide thread count: {torch.get_num_threads()}", flush=True)
    res: dict[tuple, list] = {}
    for r in range(a.rounds):
        for codec in a.codecs.split(","):
            for threads in map(int, a.threads.split(",")):
                for limited in (True, False) if r % 2 else (False, True):
                    res.setdefault((codec, threads, limited), []).append(arm(xs, codec, threads, limited))
    for (codec, threads, limited), v in sorted(res.items()):
        name = "one OpenMP thread each" if limited else "torch's count        "
        print(
            f"{codec:10s} {threads} encoding thread(s), {name}  {max(g for g, _ in v):.2f} GB/s  "
            f"{statistics.median(c for _, c in v):.2f} core-s per GB  (rounds: "
            + ", ".join(f"{g:.2f}/{c:.2f}" for g, c in v)
            + ")"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

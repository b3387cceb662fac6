"""Benchmark: every boundary codec through zg's own write path and loader, on real rows. Not a test.

    python bench/quant_store.py                                   # SmolLM2-135M's boundary 10 (bench/quant_frontier.py)
    python bench/quant_store.py --rows-from PROJECT/data/boundaries/h05.lance

For each codec: the bytes on disk (Lance data files, every column) per bf16 byte of the rows, that is bytes per
token per boundary / (hidden x 2); and a boundary pair's read rate through ``BoundaryPair.batches`` (first epoch:
every row decoded and checked; warm: from the decoded cache), with np.memmap of the same rows beside them
(bench/write_path_reads.py). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from quant_frontier import smollm2_boundaries
from write_path import real, write_path
from write_path_reads import B, loader

from zgdata.store.codec import CODECS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-from", type=Path)
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--mb", type=int, default=96, help="MB of bf16 in the pair each codec writes and reads")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.rows_from:
        xs = real(args.rows_from, args.seqs // B)
    else:
        bits = smollm2_boundaries(args.seqs, args.seq_len, [args.layer])[args.layer]
        x = torch.from_numpy(bits.view("int16")).view(torch.bfloat16)
        xs = [x[i : i + B].clone() for i in range(0, len(x) - B + 1, B)]
    batches = max(2, (args.mb << 20) // (2 * xs[0].numel() * 2))
    work = Path(tempfile.mkdtemp(prefix="zg-quant-store-"))
    res = {"hidden": xs[0].shape[2], "rows": batches * B, "source": str(args.rows_from or f"smollm2 h{args.layer}")}
    try:
        for codec in args.codecs.split(","):
            r = write_path(work, xs, boundaries=2, batches=batches, codec=codec, threads=args.threads, publish=True)
            lo = loader(r["published"])
            res[codec] = {
                "bytes_ratio": r["disk"] / r["bytes"],
                "write_gbps": r["bytes"] / r["seconds"] / 1e9,
                "first_epoch_gbps": lo["first_gbps"],
                "warm_gbps": lo["warm_gbps"],
                "memmap_gbps": lo["memmap_gbps"],
            }
            print(
                f"{codec:<10} bytes/bf16 {r['disk'] / r['bytes']:.3f}  write {res[codec]['write_gbps']:.2f} GB/s  "
                f"read first epoch {lo['first_gbps']:.2f} GB/s, warm {lo['warm_gbps']:.2f}, "
                f"np.memmap {lo['memmap_gbps']:.2f} (GB/s of bf16)",
                flush=True,
            )
            shutil.rmtree(r["stage"], ignore_errors=True)
            shutil.rmtree(work / f"pub-{codec}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: {a: round(b, 4) for a, b in v.items()} if isinstance(v, dict) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lance's writer alone, per column layout of a raw boundary's values. Not a test; a probe for the next format.

    python bench/lance_columns.py                                  # the default file version, every layout
    python bench/lance_columns.py --versions 2.0,stable --layouts fsl_u16,blob
    python bench/lance_columns.py --seq-len 2048 --hidden 4096 --mb 1024    # an 8B teacher's 16 MB rows

Four ``write_fragments`` streams (one per boundary, in threads, as materialize's ``staging.Streams``) of batches of
4 random uint16 rows (512 x 576 by default, 28 batches), fsynced, per layout of the value column:

  fsl_u16   a fixed-size list of uint16 per row: what a raw boundary stores today
  lb        a large_binary per row
  blob      a large_binary per row marked ``lance-encoding:blob`` (written out of line, read by position and size)

Printed: GB/s and the process's CPU seconds per GB, best of --repeats, and a plain write of the same number of
bytes (bench/write_path.py's: 8 MiB writes, fsync) in the same run. The machines are shared: compare within one run only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from write_path import cpu_s, plain_write
from write_path_reads import fsync_tree

T, C, B, BATCHES, STREAMS = 512, 576, 4, 28, 4
N = T * C


def shape(seq_len: int, hidden: int, mb: int) -> None:
    """Rows of ``seq_len`` x ``hidden`` values, and as many batches as make about ``mb`` MB over the streams."""
    global T, C, N, BATCHES
    T, C, N = seq_len, hidden, seq_len * hidden
    BATCHES = max(2, (mb << 20) // (STREAMS * B * N * 2))


def batch(layout: str, rows: np.ndarray) -> pa.RecordBatch:
    if layout == "fsl_u16":
        col = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), type=pa.uint16()), N)
    else:
        offsets = pa.py_buffer(np.arange(B + 1, dtype=np.int64) * 2 * N)
        col = pa.LargeBinaryArray.from_buffers(pa.large_binary(), B, [None, offsets, pa.py_buffer(rows)])
    return pa.record_batch([pa.array(np.arange(B)), col], names=["id", "v"])


def schema(layout: str, b: pa.RecordBatch) -> pa.Schema:
    f = b.schema.field("v")
    if layout == "blob":
        f = f.with_metadata({"lance-encoding:blob": "true"})
    return pa.schema([b.schema.field("id"), f])


def run(work: Path, layout: str, version: str, data: list[np.ndarray]) -> tuple[float, float]:
    from lance.fragment import write_fragments

    shutil.rmtree(work / "out", ignore_errors=True)
    sch = schema(layout, batch(layout, data[0]))

    def stream(i: int) -> None:
        batches = [batch(layout, r) for r in data]
        write_fragments(
            pa.RecordBatchReader.from_batches(sch, iter(batches)),
            str(work / "out" / f"s{i}.lance"),
            schema=sch,
            max_rows_per_file=10**9,
            data_cache_bytes=2 << 20,
            data_storage_version=version,
        )

    c0, t0 = cpu_s(), time.perf_counter()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fsync_tree(work / "out")
    gb = STREAMS * BATCHES * B * N * 2 / 1e9
    return gb / (time.perf_counter() - t0), (cpu_s() - c0) / gb


def plain(work: Path) -> float:
    """GB/s of bench/write_path.py's plain write (8 MiB writes from memory, fsync) of the same number of bytes."""
    nbytes = STREAMS * BATCHES * B * N * 2
    return nbytes / plain_write(work / "plain.bin", nbytes)[0] / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default="stable", help="Lance data storage versions (2.0, 2.1, stable...)")
    ap.add_argument("--layouts", default="fsl_u16,lb,blob")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=T, help="tokens per row")
    ap.add_argument("--hidden", type=int, default=C, help="values per token")
    ap.add_argument("--mb", type=int, default=STREAMS * BATCHES * B * N * 2 >> 20, help="MB written per run")
    args = ap.parse_args(argv)
    shape(args.seq_len, args.hidden, args.mb)
    print(f"{STREAMS} streams of {BATCHES} batches of {B} rows of {T} x {C} uint16 ({2 * N / 2**20:.1f} MiB rows)")
    os.environ.setdefault("RUST_LOG", "error")
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 65535, (B, N), dtype=np.uint16) for _ in range(BATCHES)]
    work = Path(tempfile.mkdtemp(prefix="zg-lance-columns-"))
    try:
        plain(work)  # a first write warms the disk's caches; not a figure
        print(f"plain write + fsync              {plain(work):5.2f} GB/s", flush=True)
        for version in args.versions.split(","):
            for layout in args.layouts.split(","):
                runs = [run(work, layout, version, data) for _ in range(args.repeats)]
                gbps, core_s = max(r[0] for r in runs), min(r[1] for r in runs)
                print(f"Lance {version:<7} {layout:<8} {gbps:5.2f} GB/s  {core_s:5.2f} core-s per GB", flush=True)
        print(f"plain write + fsync              {plain(work):5.2f} GB/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: data-parallel materialize, 2 shards on 2 Ray workers vs 1 shard on 1 worker, 1 torch thread each.

Not a test. One run measures side by side, on the same project and rows:

  1x1    materialize through the sharded path with materialize.workers 1 (one Ray worker, one shard)
  2x1    the same with workers 2 (two Ray workers at once, two shards of half the rows)
  local  the single-process path (workers 1, the default) with torch limited to 1 thread: the
         reference a user has today

Every arm runs in a fresh local Ray instance (started before the clock, 1 CPU per worker) and
makes ``--passes`` materialize passes: the first is cold (worker processes import torch and
load the teacher), later ones are warm (the worker keeps its teacher). Arms alternate their
order between repeats. The headline is 1x1 / 2x1 wall time (goal >= 1.6 = 0.8 x 2 workers);
it also prints the same ratio from the workers' own CPU seconds (what the wall ratio would be
if each worker had a core to itself: on a box shared with other jobs the wall ratio measures
the scheduler as much as zg), each worker's peak RSS (the task reports its process's ru_maxrss) and checks
that every arm wrote the same rows (seq_id, split, hidden bits, checksum) and stats.

The machine's load is printed (loadavg, busy share of all CPUs during each pass): on a shared
box the ratio is only as good as the quiet it ran in.

Usage:
  python bench/materialize_parallel.py                          # smollm2, 16 seqs x 512 tokens (2 shards of 8)
  python bench/materialize_parallel.py --profile tiny           # smoke run (random tiny teacher; Ray overhead dominates)
  python bench/materialize_parallel.py --workdir /tmp/zgbench-par --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import platform
import resource
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("ZG_QUIET", "1")

import torch
from harness import busy_cpu_s
from materialize import clear_outputs, setup_project  # bench/materialize.py, a sibling like harness

from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.store.lance_io import open_dataset, schema_meta
from zgdata.tokens.store import tokens_meta
from zgtrain.pipeline.profiles import profile_params


def log(msg: str) -> None:
    print(msg, flush=True)


def _snapshot(layout: Layout, part: PartitionConfig) -> dict:
    """Every row of every boundary (all columns) and its stats, to check that the arms wrote the same thing."""
    out = {}
    for n in part.names:
        ds = open_dataset(layout.boundary(n), kind="boundary")
        h = hashlib.sha256()
        for rb in ds.to_batches(columns=["hidden"]):  # every stored bit, streamed
            col = rb.column(0)
            h.update(
                col.values.slice(col.offset * col.type.list_size, len(col) * col.type.list_size)
                .to_numpy(zero_copy_only=True)
                .tobytes()
            )
        rest = ds.to_table(columns=["seq_id", "split", "checksum"])
        out[n] = (h.hexdigest(), rest, schema_meta(ds.schema)["stats"], [f.count_rows() for f in ds.get_fragments()])
    return out


def _same(a: dict, b: dict) -> bool:
    return all(a[n][0] == b[n][0] and a[n][1].equals(b[n][1]) and a[n][2] == b[n][2] for n in a)


def run_arm(
    name: str, layout: Layout, mcfg: MaterializeConfig, part: PartitionConfig, *, workers: int | None, passes: int
) -> list[dict]:
    """``passes`` materialize passes in one fresh Ray instance (``workers``) or in this process (None)."""
    import ray

    if workers is not None:
        warnings.filterwarnings("ignore", message="lance is not fork-safe")
        ray.init(
            address="local",
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            object_store_memory=128 << 20,
        )
        cfg = dataclasses.replace(mcfg, workers=workers, worker_threads=1, rows_per_file=1 << 30)
    else:
        cfg = dataclasses.replace(mcfg, workers=1)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    out = []
    try:
        for i in range(passes):
            clear_outputs(layout)
            busy, t = busy_cpu_s(), time.perf_counter()
            res = materialize(cfg, part, layout=layout, sharded=workers is not None)
            wall = time.perf_counter() - t
            share = (busy_cpu_s() - busy) / wall / (os.cpu_count() or 1)
            assert not res.skipped
            out.append(
                {
                    "arm": name,
                    "pass": i,
                    "wall": wall,
                    "tok_s": res.tokens / wall,
                    "busy": share,
                    "shards": res.shards,
                    "snapshot": _snapshot(layout, part),
                }
            )
            rss = (
                ", ".join(
                    f"pid {s['pid']} rows {s['lo']}-{s['hi'] - 1} {s['threads']} thr {s['seconds']:.1f}s "
                    f"cpu {s['cpu_seconds']:.1f}s rss {s['peak_rss_mb']:.0f} MB"
                    for s in res.shards
                )
                or f"this process, rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
            )
            log(
                f"  {name:<6} pass {i} ({'cold' if i == 0 else 'warm'}): {wall:7.2f}s  {res.tokens / wall:8.1f} tok/s  "
                f"machine busy {share:.0%}  [{rss}]"
            )
    finally:
        if workers is not None:
            ray.shutdown()
        else:
            torch.set_num_threads(threads)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--train-seqs", type=int, default=12, help="corpus.max_train_seqs (smollm2; default 12)")
    ap.add_argument("--heldout-seqs", type=int, default=4, help="corpus.max_heldout_seqs (smollm2; default 4)")
    ap.add_argument("--workdir", type=Path, default=None, help="project dir to (re)use; default a temp dir")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of the three arms (order alternates)")
    ap.add_argument("--passes", type=int, default=2, help="materialize passes per arm and round (first is cold)")
    ap.add_argument("--no-local", action="store_true", help="skip the single-process reference arm")
    args = ap.parse_args(argv)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass

    params = profile_params(args.profile)
    if args.profile == "smollm2":
        params["corpus"]["max_train_seqs"] = args.train_seqs
        params["corpus"]["max_heldout_seqs"] = args.heldout_seqs
    mcfg = section(params, MaterializeConfig, "materialize")
    part = section(params, PartitionConfig, "partition")
    tmp = None
    if args.workdir is None:
        root = tmp = Path(tempfile.mkdtemp(prefix="zgbench-par-"))
    else:
        root = args.workdir.resolve()
        root.mkdir(parents=True, exist_ok=True)
    layout = Layout(root=root)
    cmd = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    log("=" * 78)
    log(f"command      : {cmd}")
    log(
        f"host         : {platform.node()}  cpus={os.cpu_count()}  loadavg(start)="
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    log(f"torch        : {torch.__version__}  profile={args.profile}  partition={part.boundaries}")
    try:
        setup_project(root, params, force=False)
        tm = tokens_meta(layout)
        rows = sum(tm["rows"].values())
        log(
            f"rows         : {tm['rows']} x {tm['lineage']['seq_len']} tokens, batch {mcfg.batch_size}; "
            f"2x1 shards: {-(-rows // 2 // mcfg.batch_size) * mcfg.batch_size} + rest"
        )
        log("=" * 78)
        arms = [("1x1", 1), ("2x1", 2)] + ([] if args.no_local else [("local", None)])
        runs = []
        for r in range(args.repeats):
            for name, w in arms if r % 2 == 0 else arms[::-1]:
                runs += run_arm(name, layout, mcfg, part, workers=w, passes=args.passes)
        ref = runs[0]["snapshot"]
        same = all(_same(ref, x["snapshot"]) for x in runs)

        def best(arm, cold):
            xs = [x["wall"] for x in runs if x["arm"] == arm and (x["pass"] == 0) == cold]
            return min(xs) if xs else float("nan")

        log("")
        log("RESULTS (wall seconds of one materialize pass; best over repeats)")
        log("-" * 78)
        log(f"{'':<34}{'cold':>10}{'warm':>10}")
        for name, _ in arms:
            log(f"{name:<34}{best(name, True):10.2f}{best(name, False):10.2f}")
        log(
            f"{'RATIO 1x1 / 2x1 (goal >= 1.6)':<34}{best('1x1', True) / best('2x1', True):10.2f}"
            f"{best('1x1', False) / best('2x1', False):10.2f}"
        )

        def cpu_path(arm, cold):  # CPU seconds of the busiest worker: the wall time had each worker its own core
            xs = [
                max(s["cpu_seconds"] for s in x["shards"])
                for x in runs
                if x["arm"] == arm and (x["pass"] == 0) == cold and x["shards"]
            ]
            return min(xs) if xs else float("nan")

        log(
            f"{'  from worker CPU s (own core each)':<34}{cpu_path('1x1', True) / cpu_path('2x1', True):10.2f}"
            f"{cpu_path('1x1', False) / cpu_path('2x1', False):10.2f}   "
            f"(1x1 {cpu_path('1x1', False):.1f} CPU s, 2x1 busiest worker {cpu_path('2x1', False):.1f} CPU s, warm)"
        )
        if not args.no_local:
            log(
                f"{'ratio local(1 thread) / 2x1':<34}{best('local', True) / best('2x1', True):10.2f}"
                f"{best('local', False) / best('2x1', False):10.2f}"
            )
        peak = {}
        for x in runs:
            for s in x["shards"]:
                key = (x["arm"], s["pid"])
                peak[key] = max(peak.get(key, 0.0), s["peak_rss_mb"])
        for arm in ("1x1", "2x1"):
            vals = [v for (a, _), v in peak.items() if a == arm]
            if vals:
                log(f"peak RSS per worker, {arm:<14}: {', '.join(f'{v:.0f} MB' for v in sorted(vals))}")
        log(f"driver peak RSS               : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        log(
            f"fragments per boundary (2x1)  : {next(x for x in runs if x['arm'] == '2x1')['snapshot'][part.names[0]][3]}"
        )
        log(f"same rows, bits, checksums and stats in every arm and pass: {'yes' if same else 'NO'}")
        log(
            f"machine busy share per pass: {[round(x['busy'], 2) for x in runs]}  "
            f"loadavg(end)={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        return 0 if same else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

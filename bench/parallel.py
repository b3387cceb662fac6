"""Benchmark `zg repro`'s block phase: N Ray workers with 1 thread each against the same blocks run serially
with 1 thread, measured side by side in one run (arms alternate). Not a test; prints ratios.

    python bench/parallel.py                                   # tiny profile, 2 blocks, 400 steps of 16 x 64 tokens
    python bench/parallel.py --workdir /tmp/zgbench-par --steps 800 --repeats 3

- serial:   one fresh Python process (torch threads 1) calls the trainer for each block in turn
            (``zgtrain.exec.stage.train_one``, what `zg repro --jobs 1` runs); timed from the first block's
            start to the last block's end, after imports.
- parallel: ``zgtrain.exec.ray_tasks.run_blocks`` (what `zg repro --jobs N` runs) on a Ray cluster of N CPUs that the
            bench starts once (``ray.cluster_utils.Cluster``, not timed); timed from submitting the tasks to the
            last result, so each run pays Ray's worker start-up and imports (a new driver gets new workers).
Both arms train the same params in their own copy of one materialized project and must end in the same
``state_sha256`` per block (checked). Peak RSS per worker is its process's ru_maxrss (Ray's worker baseline
included). Goal: speedup >= 0.8 * N (1.6 for N = 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from harness import BIN, busy_cpu_s, environ, params, run, scaffold

ROOT = Path(__file__).resolve().parents[1]


def _zg(*args, cwd) -> None:
    run([BIN / "zg", *args], cwd)


def build(workdir: Path, profile: str, blocks: int) -> Path:
    """A materialized project (teacher, tokens, boundaries), built once per workdir."""
    base = workdir / "base"
    if (base / "data" / "boundaries").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    base = scaffold(base, profile, message=None)
    if profile == "tiny" and blocks != 2:  # tiny's teacher has 4 layers: up to 4 one-layer blocks
        params(base, lambda p: p["partition"].update(boundaries=list(range(0, 4 + 1, 4 // blocks))))
        _zg("pipeline", cwd=base)
    for cmd in (("teacher", "prepare"), ("data", "tokenize"), ("data", "materialize")):
        _zg(*cmd, cwd=base)
    return base


def arm_copy(base: Path, name: str, steps: int, batch: int) -> Path:
    dst = base.parent / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst, symlinks=True)
    train = {"steps": steps, "batch_size": batch, "threads": 1, "checkpoint_every": 0, "heldout_rows": 1}
    params(dst, lambda p: p["train"].update(train))
    return dst


_SERIAL = """
import json, sys, time
from zgtrain.exec.stage import train_one
root, keys = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
out = [train_one(root, k) for k in keys]
print(json.dumps({"seconds": time.perf_counter() - t0, "blocks": out}))
"""


def serial(root: Path, keys: list[str]) -> dict:
    env = environ(ZG_QUIET="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return json.loads(run([sys.executable, "-c", _SERIAL, root, *keys], env=env).stdout.strip().splitlines()[-1])


def parallel(root: Path, keys: list[str], address: str, jobs: int) -> dict:
    from zgtrain.exec import ray_tasks as ray_exec

    os.environ["ZG_QUIET"] = "1"
    out = []
    t0 = time.perf_counter()
    ray_exec.run_blocks(
        root,
        keys,
        needs={k: {"cpus": 1, "gpus": 0} for k in keys},
        jobs=jobs,
        address=address,
        on_update=lambda u: None,
        on_result=out.append,
    )
    return {"seconds": time.perf_counter() - t0, "blocks": out}


def measured(fn, *args) -> dict:
    """``fn(*args)`` plus how busy the machine was meanwhile: ``foreign`` is the share of all cores that
    processes other than the arm's own blocks used (0: quiet machine; 1: the arm got no CPU at all)."""
    busy = busy_cpu_s()
    r = fn(*args)
    own = sum(b.get("cpu_seconds", 0) for b in r["blocks"])
    r["foreign"] = max(busy_cpu_s() - busy - own, 0) / r["seconds"] / (os.cpu_count() or 1)
    r["own_cpu_s"] = own
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zgbench-parallel"))
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--jobs", type=int, default=2, help="Ray workers (and blocks), 1 thread each")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ray.cluster_utils import Cluster

    base = build(a.workdir, a.profile, a.jobs)
    keys = list(params(base)["blocks"])[: a.jobs]
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": a.jobs, "object_store_memory": 100 * 1024 * 1024, "include_dashboard": False},
    )
    try:
        rows = []
        for i in range(a.repeats):
            s = measured(serial, arm_copy(base, "serial", a.steps, a.batch_size), keys)
            p = measured(parallel, arm_copy(base, "parallel", a.steps, a.batch_size), keys, cluster.address, a.jobs)
            same = {b["key"]: b.get("state_sha256") for b in s["blocks"]} == {
                b["key"]: b.get("state_sha256") for b in p["blocks"]
            }
            rows.append((s, p, same))
            print(
                f"repeat {i}: serial {s['seconds']:.1f} s, parallel {p['seconds']:.1f} s, speedup "
                f"{s['seconds'] / p['seconds']:.2f}x (goal >= {0.8 * a.jobs:.1f}), same state_sha256: {same}; "
                f"blocks' CPU s serial {s['own_cpu_s']:.1f} / parallel {p['own_cpu_s']:.1f}; other processes "
                f"used {s['foreign']:.0%} / {p['foreign']:.0%} of the machine"
            )
            for b in p["blocks"]:
                print(
                    f"  worker {b.get('node')} pid {b.get('pid')}: {b['key']} {b.get('status')} in "
                    f"{b.get('seconds', 0):.1f} s, {b.get('threads')} thread(s), peak RSS "
                    f"{b.get('peak_rss_mb', 0):.0f} MB"
                )
            print(f"  serial process: peak RSS {max(b.get('peak_rss_mb', 0) for b in s['blocks']):.0f} MB")
            # what the wall ratio would be if each worker had a core of its own: the serial blocks' CPU seconds
            # over the slowest worker's (its imports and start-up included, Ray's worker start excluded)
            print(f"  from CPU seconds: {s['own_cpu_s'] / max(b.get('cpu_seconds', 0) for b in p['blocks']):.2f}x")
        best = max(s["seconds"] / p["seconds"] for s, p, _ in rows)
        print(
            f"SUMMARY: {a.jobs} blocks x {a.steps} steps x {a.batch_size} seqs ({a.profile}); speedup "
            f"best {best:.2f}x over {a.repeats} repeat(s); bits equal in all: {all(r[2] for r in rows)}"
        )
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()

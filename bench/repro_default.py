"""The parallel-repro check on a real profile: `zg repro --jobs N` against a plain `dvc repro`, side by side.

    python bench/repro_default.py                            # default profile (smollm2), --jobs 2, train.threads 1
    python bench/repro_default.py --profile tiny --workdir /tmp/zgbench-repro-tiny   # a quick dry run

One project is built up to the blocks (`zg init`, then `dvc repro verify`: teacher, tokens, materialize,
verify) and committed to git. It is copied twice:
- serial:   `dvc repro` (blocks one after another, each with `train.threads` torch threads);
- parallel: `zg repro --jobs N` (N blocks at once on a local Ray cluster, each with `train.threads`).
Both arms use the same params, so they must end in the same dvc.lock hashes (the files that hold wall-clock
figures left out: none remain, they are in .zg/timings/), the same block `state_sha256` and the same `metrics/eval.json`:
the script checks all three and exits non-zero on any difference. It prints both wall times and their ratio.
`train.threads` is part of a block's identity (the thread count changes float reductions on this CPU), so
both arms set the same value; 1 thread x N jobs is the setting that can use N cores.
Not a test: it trains every block of the profile twice. Measured on the default profile (2 shared cores,
2026-11-30): serial 1,579 s, parallel 1,317 s, speedup 1.20, all three views identical.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml
from harness import BIN, commit, params, run, scaffold

TIMED_KEYS = {"tokens_per_s", "seconds"}  # wall-clock figures inside metrics files


def timed_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / "metrics").rglob("*.json")}


def lock_view(root: Path) -> dict:
    """dvc.lock stages, with the md5/size of metrics files (wall-clock figures inside) left out."""
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    skip = timed_files(root)
    return {
        name: {**e, "outs": [{"path": o["path"]} if o["path"] in skip else o for o in e.get("outs", [])]}
        for name, e in stages.items()
    }


def metrics_view(root: Path) -> dict:
    out = {}
    for p in sorted((root / "metrics").rglob("*.json")):
        d = json.loads(p.read_text())
        out[str(p.relative_to(root))] = {k: v for k, v in d.items() if k not in TIMED_KEYS}
    return out


def build(workdir: Path, profile: str, threads: int) -> Path:
    base = workdir / "base"
    if (base / "dvc.lock").exists():
        return base
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    base = scaffold(base, profile, message=None)
    params(base, lambda p: p["train"].update(threads=threads))
    run([BIN / "dvc", "repro", "verify"], base)  # harness.run: this environment's bin first, for the stages' `zg`
    commit(base, "upstream stages")
    return base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="train.threads in both arms")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zgbench-repro"))
    a = ap.parse_args()
    base = build(a.workdir, a.profile, a.threads)
    arms = {}
    for name in ("serial", "parallel"):
        dst = a.workdir / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(base, dst, symlinks=True)
        cmd = [BIN / "dvc", "repro"] if name == "serial" else [BIN / "zg", "repro", "--jobs", a.jobs]
        arms[name] = run(cmd, dst).wall_s
        print(
            f"{name:9s} {' '.join(map(str, cmd[-3:] if name == 'parallel' else cmd[-2:]))}: {arms[name]:.1f} s",
            flush=True,
        )
    s, p = a.workdir / "serial", a.workdir / "parallel"
    same = {
        "dvc.lock": lock_view(s) == lock_view(p),
        "metrics (state_sha256, eval)": metrics_view(s) == metrics_view(p),
    }
    for what, ok in same.items():
        print(f"{what}: {'identical' if ok else 'DIFFERENT'}")
    print(f"speedup serial / parallel = {arms['serial'] / arms['parallel']:.2f} (jobs {a.jobs}, threads {a.threads})")
    sys.exit(0 if all(same.values()) else 1)


if __name__ == "__main__":
    main()

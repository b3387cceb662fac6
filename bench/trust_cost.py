"""Benchmark the cost of checking DVC-tracked inputs against dvc.lock (zgdata/trust/dvc_lock.py). Not a test; prints ratios
measured side by side in one run.

    python bench/trust_cost.py                          # builds a tiny project under --work (zg init, dvc repro)
    python bench/trust_cost.py --project /path/to/proj --key b01

The project must be reproduced (dvc.lock present, outputs in the workspace). Measured, each in a fresh process
(no in-process memo, so what a stage pays when it starts):
  check first   `trust.verify` of block KEY's DVC-tracked inputs with no hash cache (.zg/trust.json removed):
                every file is hashed
  check cached  the same with the stat-keyed cache that the first check wrote
  full first / full cached   the same for `trust.verify_all` (`zg data verify --full`): every recorded output
  train         `zg train block KEY --restart` wall time (the process, model load and evaluation included; it
                runs the cached check itself, so this is what a user waits for)
  pull          `dvc pull` of block KEY's inputs from a local remote into a fresh git clone (the team workflow:
                clone, pull one block's inputs, train)
Ratios: each check over train, and over pull + train.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from harness import commit, environ, run, scaffold

ENV = environ(ZG_QUIET="1")

_CHILD = """
import sys, time
from pathlib import Path
from zgdata.trust import dvc_lock as trust
paths = [Path(p) for p in sys.argv[2:]]
t0 = time.perf_counter()
c = trust.verify_all(Path(".")) if sys.argv[1] == "all" else trust.verify(*paths)
print(time.perf_counter() - t0, c.outputs, c.hashed, c.cached)
"""


def _sh(cmd: list[str], cwd: Path) -> float:
    return run(cmd, cwd, env=ENV).wall_s


def _check(project: Path, what: str, deps: list[str]) -> tuple[float, str]:
    secs, outputs, hashed, cached = run([sys.executable, "-c", _CHILD, what, *deps], project, env=ENV).stdout.split()
    return float(secs), f"{outputs} outputs, {hashed} files hashed, {cached} from the cache"


def _block_deps(project: Path, key: str) -> list[str]:
    """Block KEY's dependencies that dvc.lock records as outputs of another stage (what `dvc pull` fetches)."""
    import yaml

    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    outs = {o["path"] for s in lock.values() for o in s.get("outs") or []}
    return [d["path"] for d in lock[f"train@{key}"]["deps"] if d["path"] in outs]


def _tiny(work: Path) -> Path:
    project = work / "tiny"
    if (project / "dvc.lock").exists():
        return project
    shutil.rmtree(project, ignore_errors=True)
    print(f"building a tiny project in {project} ...", file=sys.stderr)
    project = scaffold(project, "tiny", env=ENV)
    _sh(["dvc", "repro", "-q"], project)
    commit(project, "repro", env=ENV)
    return project


def _pull(project: Path, work: Path, deps: list[str]) -> float:
    remote, clone = work / "remote", work / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(remote, ignore_errors=True)
    _sh(["dvc", "remote", "add", "-f", "--local", "bench", str(remote)], project)  # .dvc/config.local: git-ignored
    _sh(["dvc", "push", "-q", "-r", "bench", *deps], project)
    _sh(["git", "clone", "-q", str(project), str(clone)], work)
    _sh(["dvc", "remote", "add", "-f", "--local", "bench", str(remote)], clone)
    return _sh(["dvc", "pull", "-q", "-r", "bench", *deps], clone)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, help="a reproduced project (default: a tiny one built under --work)")
    ap.add_argument("--key", default="b01", help="the block to train and pull")
    ap.add_argument("--work", type=Path, default=Path("/tmp/zg-trustbench"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    project = args.project.resolve() if args.project else _tiny(args.work)
    deps = _block_deps(project, args.key)
    state = project / ".zg" / "trust.json"
    rows = {}
    for what, paths in (("block", deps), ("all", [])):
        state.unlink(missing_ok=True)
        rows[f"{what} first"] = _check(project, what, paths)
        rows[f"{what} cached"] = _check(project, what, paths)
    train = _sh(["zg", "train", "block", args.key, "--restart"], project)
    pull = _pull(project, args.work, deps)
    print(f"project {project}, block {args.key}: inputs {', '.join(deps)}")
    print(f"train {train:.2f} s (zg train block {args.key} --restart), dvc pull of its inputs {pull:.2f} s")
    print(f"{'check':<14}{'seconds':>9}{'/ train':>10}{'/ (pull + train)':>18}  what")
    for name, (secs, what) in rows.items():
        print(f"{name:<14}{secs:>9.3f}{secs / train:>10.4f}{secs / (pull + train):>18.4f}  {what}")
    print(json.dumps({"train_s": train, "pull_s": pull, "checks": {k: v[0] for k, v in rows.items()}}))


if __name__ == "__main__":
    main()

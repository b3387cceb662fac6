"""How long `zg` takes to answer, against a bare interpreter and `dvc status`; and what imports cost the stages.

    python bench/cli_latency.py [--repeats 5] [--project DIR] [--no-stages] [--no-exit]

Not a test; prints, in one run:

1. The median wall time (over --repeats runs) of `zg --help`, `zg` (no command: the same page, exit 2),
   `zg train block --help`, `zg params`, `zg pipeline`, `zg init` and `zg data inspect`, each as a ratio to
   `python -c pass` and to `dvc status` on the same project; the commands take turns run by run, so a change
   of the machine's load falls on all of them. Goals: `zg --help` within 3x of a bare interpreter, `zg data
   inspect` within 2x of `dvc status`; the last line says whether each is met.
2. For each stage command of a tiny `dvc repro` (the `cmd:` lines of its dvc.yaml, run one after another as
   dvc would, each in its own process), the CPU seconds its imports took against the process's CPU time
   (user + sys, getrusage of the child) and wall. Import CPU is counted by a wrapper around the interpreter's
   import of each module that is not imported by another (the CPU time of the importing thread), not by
   `python -X importtime`, whose wall times count the waits of a loaded machine as imports.

3. The CPU seconds of a process that imports transformers' Llama modeling code and exits: with Python's
   defaults, with ``gc.freeze()`` before its exit, and as the `zg` script (``zgtrain.cli.run``) runs: the
   collector's first threshold raised before the imports (``GC_FIRST_THRESHOLD``) and ``gc.freeze()`` before the
   exit; the arms take turns (--repeats runs each). The imports create, and the interpreter's shutdown walks,
   the ~390,000 objects the collector tracks.

Without --project it builds a tiny project (`zg init --profile tiny`) in a temporary folder; the stages
of part 2 build its teacher, tokens and boundaries, which `zg data inspect` then reads. With --project
(a project whose tokens and boundaries exist) part 2 is skipped unless it is a fresh tiny project.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from harness import BIN, environ, run, scaffold

STAGES = [
    ["teacher", "prepare"],
    ["data", "tokenize"],
    ["data", "materialize"],
    ["data", "verify"],
    ["train", "block", "b00"],
    ["train", "block", "b01"],
    ["train", "assemble"],
    ["train", "evaluate"],
]
# Runs the `zg` script with ARGS, counting the importing thread's CPU seconds in outermost module imports
# (nested ones are inside them); writes the sum to the file named first.
_PROBE = """
import importlib._bootstrap as b, runpy, sys, time
out, script = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
inner, spent, depth = b._find_and_load, [0.0], [0]
def find_and_load(*a, **k):
    depth[0] += 1
    t0 = time.thread_time() if depth[0] == 1 else None
    try:
        return inner(*a, **k)
    finally:
        depth[0] -= 1
        if t0 is not None:
            spent[0] += time.thread_time() - t0
b._find_and_load = find_and_load
try:
    runpy.run_path(script, run_name="__main__")
finally:
    open(out, "w").write(repr(spent[0]))
"""


def _env() -> dict:
    # DVC_NO_ANALYTICS: each dvc command leaves an analytics daemon running, which took CPU from the next command
    return environ(ZG_QUIET="1", DVC_NO_ANALYTICS="1")


def _wall(cmd: list[str], cwd: Path, code: int = 0) -> float:
    """Wall seconds of one run of ``cmd``, which must exit with ``code``."""
    return run(cmd, cwd, env=_env(), code=code).wall_s


def _stage(args: list[str], cwd: Path, scratch: Path) -> tuple[float, float, float]:
    """(import CPU seconds, CPU seconds, wall seconds) of one `zg ARGS` process."""
    out = scratch / "imports.txt"
    ran = run([sys.executable, "-c", _PROBE, out, BIN / "zg", *args], cwd, env=_env())
    return float(out.read_text()), ran.cpu_s, ran.wall_s


def stage_imports(project: Path, scratch: Path) -> None:
    print("\nimports in the stage processes of a tiny `dvc repro` (each stage's cmd, in order, one process each)")
    print(f"{'stage command':<24} {'import CPU s':>12} {'CPU s':>7} {'wall s':>7} {'imports/CPU':>11}")
    total = [0.0, 0.0, 0.0]
    for args in STAGES:
        imp, cpu, wall = _stage(args, project, scratch)
        total = [total[0] + imp, total[1] + cpu, total[2] + wall]
        print(f"{'zg ' + ' '.join(args):<24} {imp:12.2f} {cpu:7.2f} {wall:7.2f} {imp / cpu:11.0%}")
    print(f"{'all stages':<24} {total[0]:12.2f} {total[1]:7.2f} {total[2]:7.2f} {total[0] / total[1]:11.0%}")
    print("(CPU counts every thread of the stage and of the processes it starts; imports run on one)")


def latency(project: Path, repeats: int, scratch: Path) -> None:
    zg = str(BIN / "zg")
    rows = [  # (name, command, exit code); None: `zg init` into a new folder each time
        ("python -c pass", [sys.executable, "-c", "pass"], 0),
        ("dvc status", [str(BIN / "dvc"), "status"], 0),
        ("zg --help", [zg, "--help"], 0),
        ("zg (no command)", [zg], 2),
        ("zg train block --help", [zg, "train", "block", "--help"], 0),
        ("zg params", [zg, "params"], 0),
        ("zg pipeline", [zg, "pipeline"], 0),
        ("zg init --profile tiny", None, 0),
        ("zg data inspect", [zg, "data", "inspect"], 0),
    ]
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for i in range(repeats):  # one run of each command in turn: a change of load falls on all of them
        for name, cmd, code in rows:
            cwd = project
            if cmd is None:
                shutil.rmtree(scratch / f"init{i}", ignore_errors=True)
                cmd, cwd = [zg, "init", str(scratch / f"init{i}"), "--profile", "tiny"], scratch
            times[name].append(_wall(cmd, cwd, code))
    t = {name: statistics.median(v) for name, v in times.items()}
    base, dvc = t.pop("python -c pass"), t.pop("dvc status")
    print(f"median of {repeats} runs on {project}: python -c pass {base:.3f} s, dvc status {dvc:.3f} s")
    print(f"{'command':<24} {'wall s':>7} {'/ python':>9} {'/ dvc status':>13}")
    for name, wall in t.items():
        print(f"{name:<24} {wall:7.3f} {wall / base:8.1f}x {wall / dvc:12.2f}x")
    help_ok, inspect_ok = t["zg --help"] <= 3 * base, t["zg data inspect"] <= 2 * dvc
    print(
        f"goals: zg --help <= 3x python -c pass ({'met' if help_ok else 'NOT met'}, {t['zg --help'] / base:.1f}x); "
        f"zg data inspect <= 2x dvc status ({'met' if inspect_ok else 'NOT met'}, {t['zg data inspect'] / dvc:.2f}x)"
    )


def _cpu(cmd: list[str]) -> float:
    """CPU seconds (user + sys) of one run of ``cmd``, which must succeed."""
    return run(cmd, env=_env()).cpu_s


def exit_cost(repeats: int) -> None:
    from zgtrain.cli import GC_FIRST_THRESHOLD

    load = "from transformers.models.llama import modeling_llama"
    raise_first = f"import gc; gc.set_threshold({GC_FIRST_THRESHOLD}, *gc.get_threshold()[1:]); "
    arms = {  # Python's defaults; gc.freeze() before the exit; what the `zg` script does (both)
        "plain exit": load,
        "gc.freeze() then exit": f"{load}; import gc; gc.freeze()",
        f"first threshold {GC_FIRST_THRESHOLD:,}, gc.freeze() then exit (zg)": f"{raise_first}{load}; gc.freeze()",
    }
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):  # the arms take turns
        for name, code in arms.items():
            cpu[name].append(_cpu([sys.executable, "-c", code]))
    med = {name: statistics.median(runs) for name, runs in cpu.items()}
    plain = med["plain exit"]
    print(f"\nimport transformers' Llama modeling code, then exit: median CPU s of {repeats} runs each")
    for name, s in med.items():
        print(f"{name:<52} {s:5.2f} s" + (f"  ({plain - s:.2f} s less per process)" if s != plain else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--project", type=Path, help="a project whose tokens and boundaries exist (default: build one)")
    ap.add_argument("--no-stages", action="store_true", help="skip part 2 (the stage processes' imports)")
    ap.add_argument("--no-exit", action="store_true", help="skip part 3 (the collector's cost at import and at exit)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zg-cli-latency-") as tmp:
        scratch = Path(tmp)
        project = a.project
        if project is None:
            project = scaffold(scratch / "proj", "tiny", message=None, env=_env())
        print(f"zg CLI latency ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start)")
        if a.project is None and not a.no_stages:
            stage_imports(project, scratch)  # builds the project's data, which `zg data inspect` reads below
            print()
        elif a.project is None:
            for args in STAGES[:3]:
                run([BIN / "zg", *args], project, env=_env())
        latency(project, a.repeats, scratch)
        if not a.no_exit:
            exit_cost(a.repeats)


if __name__ == "__main__":
    main()

"""Where the test suite's CPU goes: a py-spy profile of the whole suite, summarized.

The suite is CPU-bound on 2 cores (its budget: README, "Running the tests" in docs/concepts/guarantees.md), so the
way to a shorter run is fewer CPU-seconds. This script runs `make test`'s pytest command under py-spy (sampling
every process it starts: the pytest workers, each `zg` and `dvc` process, Ray's workers), brackets it with the
machine's busy CPU-seconds from /proc/stat, and prints:

- the busy CPU-seconds and the wall time of the run;
- the share of samples per kind of process (the pytest workers, `zg train block`, a Ray worker, `dvc status`...);
- the share spent importing modules, and in transformers' scan of its model files (``define_import_structure``);
- the functions with the most samples outside imports, and the callers of the pure-Python YAML constructors
  (PyYAML's, and ruamel's in DVC).

py-spy is not a dependency of the project: `pip install py-spy` (any environment; it attaches from outside) or
pass its path with --py-spy. `--summarize FILE` reads a profile written before instead of running the suite.
Samples count threads that py-spy sees as active, which includes some that wait in C code (Ray's idle workers,
thread pools): read the shares, not the sample counts, as CPU, and the busy CPU-seconds for the total.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROCESS = re.compile(r'process \d+:"([^"]*)"')
IMPORT_FRAMES = ("_find_and_load", "_LazyModule._get_module")


def busy_cpu_s() -> float:
    """The machine's busy CPU-seconds since boot (user, nice, system, irq, softirq of /proc/stat's cpu line)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")


def suite_command(python: str, workers: str, *args: str) -> list[str]:
    """`make test`'s pytest command (its workers, grouping and order), ARGS last (options, then what to run)."""
    return [python, "-m", "pytest", "-q", "-n", workers, "--dist", "loadgroup", "--no-loadscope-reorder", *args]


def suite_env(bin_dir: Path) -> dict:
    """`make test`'s environment: the venv's `zg` and `dvc` first on PATH, bytecode written."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": ""}


def process_kind(stack: str) -> str:
    """The innermost process of a sample, by its command: script name and up to two arguments."""
    procs = PROCESS.findall(stack)
    if len(procs) <= 1:
        return "(pytest main)"
    words = procs[-1].split()
    if "exec(eval(sys.stdin.readline()))" in procs[-1]:
        return "(pytest-xdist worker)"
    if "default_worker.py" in procs[-1] or procs[-1].startswith("ray::"):
        return "(Ray worker)"
    return " ".join(w.rsplit("/", 1)[-1] for w in words[1:4])[:60]


def frame(f: str) -> str:
    """``function (file.py`` without the line number and the folders."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else f


def samples(path: Path):
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            yield stack, int(n)


def summarize(path: Path, top: int) -> None:
    total = imports = scan = 0
    kinds, own, yaml_callers = collections.Counter(), collections.Counter(), collections.Counter()
    for stack, n in samples(path):
        total += n
        kinds[process_kind(stack)] += n
        frames = stack.split(";")
        if any(k in stack for k in IMPORT_FRAMES):
            imports += n
            scan += n * ("define_import_structure" in stack)
            continue
        own[frame(frames[-1])] += n
        hits = [i for i, f in enumerate(frames) if "yaml/constructor.py" in f]
        if hits:
            caller = [frame(f) for f in frames[max(0, hits[0] - 6) : hits[0]] if "yaml" not in f][-3:]
            yaml_callers[" < ".join(reversed(caller))] += n
    print(f"{total} samples in {path}")
    print(f"imports: {imports / total:.1%} of all samples; transformers' define_import_structure {scan / total:.1%}")
    print("\nby process kind:")
    for k, v in kinds.most_common(top):
        print(f"  {v / total:6.1%}  {k}")
    print("\nmost samples outside imports (innermost function):")
    for k, v in own.most_common(top):
        print(f"  {v / total:6.1%}  {k[:110]}")
    print("\nthe YAML constructors (PyYAML's; ruamel's in DVC), by caller:")
    for k, v in yaml_callers.most_common(10):
        print(f"  {v / total:6.1%}  {k[:150]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/zg-suite-profile.txt"), help="py-spy's raw profile")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="the py-spy executable")
    ap.add_argument("--rate", type=int, default=20, help="samples per second per thread (py-spy -r)")
    ap.add_argument("--workers", default="3", help="pytest -n, as `make test` uses on 2 cores")
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    ap.add_argument("--summarize", type=Path, help="summarize this profile instead of running the suite")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize, args.top)
        return
    venv_bin = ROOT / ".venv" / "bin"
    cmd = [args.py_spy, "record", "-r", str(args.rate), "--subprocesses", "-f", "raw", "-o", str(args.out), "--"]
    cmd += suite_command(str(venv_bin / "python"), args.workers, "tests")
    env = suite_env(venv_bin)
    cpu0, t0 = busy_cpu_s(), time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    cpu, wall = busy_cpu_s() - cpu0, time.monotonic() - t0
    print(
        f"\nthe suite under py-spy: rc {rc}, {wall:.0f} s of wall time, {cpu:.0f} busy CPU-s on {os.cpu_count()} CPUs"
    )
    summarize(args.out, args.top)
    sys.exit(rc)


if __name__ == "__main__":
    main()

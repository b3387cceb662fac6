"""The test suite's CPU-seconds, counted exactly: each test's own and its processes', and each kind of command's.

`bench/suite_profile.py` samples stacks (where inside a process the CPU goes); this script counts, without a
profiler, how many CPU-seconds each test costs with everything it started, so the tests that cost the most are
named by a figure and not by a share of samples. It runs `make test`'s pytest command with two additions, both
in a temporary folder put on PYTHONPATH (the project and the tests are unchanged):

- a pytest plugin that takes ``getrusage`` of the worker (the test's own CPU, threads included) and of its
  reaped children (every process the test started and waited for, with their own reaped children: a `dvc repro`
  and the `zg` stages under it) before and after each test, setup and teardown included;
- a ``sitecustomize`` that makes every Python process the suite starts append its argv and its own CPU to a log
  when it exits (a process killed by a signal writes nothing; Ray's workers are ended that way).

It brackets the run with the machine's busy CPU-seconds (/proc/stat) and prints the total, the share the tests
account for (the rest: Ray's processes, pytest's collection, the kernel), the costliest files and tests, and the
processes by kind of command (count, CPU-seconds, per process). `--summarize DIR` reads a run's logs again.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite_profile import busy_cpu_s, suite_command, suite_env  # bench/: this script's folder is on sys.path

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = """
import json, os, resource, time
import pytest

def _cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    rec = {"test": item.nodeid, "own": _cpu(resource.RUSAGE_SELF) - own,
           "children": _cpu(resource.RUSAGE_CHILDREN) - children, "wall": time.monotonic() - wall}
    with open(os.environ["ZG_SUITE_CPU_TESTS"], "a") as f:
        f.write(json.dumps(rec) + "\\n")
"""

SITECUSTOMIZE = """
import atexit, os, sys

def _log():
    import json, resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    rec = {"argv": sys.argv[:4], "cpu": r.ru_utime + r.ru_stime, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    try:
        with open(os.environ["ZG_SUITE_CPU_PROCS"], "a") as f:
            f.write(json.dumps(rec) + "\\n")
    except (KeyError, OSError):
        pass

if os.environ.get("ZG_SUITE_CPU_PROCS"):
    atexit.register(_log)
"""


def command_kind(argv: list[str]) -> str:
    """`zg train block`, `dvc status`, `(pytest-xdist worker)`: the script's name and its subcommand words."""
    if not argv:
        return "?"
    name = argv[0].rsplit("/", 1)[-1]
    if name == "-c":
        return "(pytest-xdist worker or python -c)"
    if name == "__main__.py":  # `python -m dvc ...` (DVC runs itself so for some commands)
        name = "python -m"
    words = [a for a in argv[1:3] if not a.startswith("-") and "/" not in a]
    return " ".join([name, *words])


def summarize(logs: Path, top: int) -> None:
    tests = [json.loads(line) for line in (logs / "tests.jsonl").read_text().splitlines()]
    procs = [json.loads(line) for line in (logs / "procs.jsonl").read_text().splitlines()]
    meta = json.loads((logs / "run.json").read_text()) if (logs / "run.json").exists() else {}
    own, children = sum(t["own"] for t in tests), sum(t["children"] for t in tests)
    if meta:
        print(f"wall {meta['wall_s']:.0f} s, busy CPU {meta['busy_cpu_s']:.0f} s, pytest exit {meta['rc']}")
    print(
        f"{len(tests)} tests: {own + children:.0f} CPU-s accounted, {own:.0f} in the pytest workers, "
        f"{children:.0f} in the processes they started and waited for"
        + (f" ({(own + children) / meta['busy_cpu_s']:.0%} of the busy CPU)" if meta else "")
    )
    by_file = collections.Counter()
    for t in tests:
        by_file[t["test"].split("::")[0]] += t["own"] + t["children"]
    print(f"\nfiles by CPU-seconds (top {top}):")
    for f, s in by_file.most_common(top):
        print(f"  {s:7.1f}  {f}")
    print(f"\ntests by CPU-seconds (top {top}): total = own + started processes, wall")
    for t in sorted(tests, key=lambda t: -(t["own"] + t["children"]))[:top]:
        print(
            f"  {t['own'] + t['children']:6.1f} = {t['own']:5.1f} + {t['children']:6.1f}  {t['wall']:6.1f} s  "
            f"{t['test'][:110]}"
        )
    kinds: dict[str, list[float]] = collections.defaultdict(list)
    for p in procs:
        kinds[command_kind(p["argv"])].append(p["cpu"])
    print(f"\nprocesses that exited normally, by command (top {top}): CPU-s, count, CPU-s each")
    for k, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"  {sum(v):7.1f}  {len(v):4d}  {sum(v) / len(v):5.2f}  {k}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for the logs (default: a new temporary folder)")
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="summarize an earlier run's logs; run nothing")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--workers", default="3", help="pytest-xdist workers (make test: TEST_WORKERS, 3 on 2 cores)")
    ap.add_argument("pytest_args", nargs="*", default=["tests"], help="what pytest runs (default: tests)")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(args.summarize, args.top)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="zg-suite-cpu-"))
    out.mkdir(parents=True, exist_ok=True)
    hooks = out / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "zg_suite_cpu_plugin.py").write_text(PLUGIN)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    for name in ("tests.jsonl", "procs.jsonl"):
        (out / name).unlink(missing_ok=True)
    env = {
        **suite_env(Path(sys.executable).parent),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
        "ZG_SUITE_CPU_TESTS": str(out / "tests.jsonl"),
        "ZG_SUITE_CPU_PROCS": str(out / "procs.jsonl"),
    }
    cmd = suite_command(sys.executable, args.workers, "-p", "zg_suite_cpu_plugin", *args.pytest_args)
    print(f"logs in {out}\n{' '.join(cmd)}", flush=True)
    busy, t0 = busy_cpu_s(), time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    meta = {"wall_s": time.monotonic() - t0, "busy_cpu_s": busy_cpu_s() - busy, "rc": rc}
    (out / "run.json").write_text(json.dumps(meta))
    print()
    summarize(out, args.top)
    return rc


if __name__ == "__main__":
    sys.exit(main())

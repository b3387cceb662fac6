"""What the bench scripts share: run and time a command, account for other processes' CPU, scaffold a project.

A script imports it as a sibling module (``import harness``): ``python bench/X.py`` puts the script's folder,
bench/, first on ``sys.path``. zgdata and zgtrain come from the environment (installed editable in .venv), so
no script adds the repository to ``sys.path``. Results a script keeps go under ``OUT`` (bench/out/<name>);
bench/README.md lists the scripts, their commands and where their results are.
"""

from __future__ import annotations

import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"  # recorded results: OUT / <script's name>[.txt]
BIN = Path(sys.executable).parent  # this interpreter's bin: its zg and dvc


def environ(**extra: str) -> dict:
    """This process's environment with ``BIN`` first on PATH (so DVC's stages run this environment's `zg`), plus
    EXTRA."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


@dataclass
class Ran:
    """One finished command: its exit code, its output (None where it was not captured) and what it took."""

    cmd: list[str]
    cwd: Path
    code: int
    stdout: str | None
    stderr: str | None
    wall_s: float
    cpu_s: float  # user + sys of the children that finished meanwhile (exact when one command runs at a time)


def children_cpu_s() -> float:
    """CPU seconds (user + sys) of this process's finished children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def shown(cmd: list[str]) -> str:
    """CMD as a shell line; an inline script (an argument with line breaks) is shown as its line count."""
    return " ".join(f"'<{a.count(chr(10)) + 1}-line script>'" if "\n" in a else shlex.quote(a) for a in cmd)


def failure(ran: Ran, tail: int = 3000) -> str:
    """What went wrong: the command, its folder, its exit code and the last TAIL characters of each stream."""
    head = f"{shown(ran.cmd)} failed in {ran.cwd} (exit {ran.code})"
    if ran.stdout is None:
        return f"{head}; its output is above"
    streams = [s[-tail:].rstrip() for s in (ran.stdout, ran.stderr) if s.strip()]
    return (f"{head}:\n" + "\n".join(streams)) if streams else f"{head}, with no output"


def run(
    cmd: list, cwd: Path | str | None = None, *, env: dict | None = None, code: int | None = 0, capture: bool = True
) -> Ran:
    """Run CMD (its items made strings) in CWD with ENV (default ``environ()``) and time it.

    CAPTURE keeps stdout and stderr as text; without it they go to this process's own. An exit code other than
    CODE ends the script with ``failure``'s message; with CODE None the caller reads ``code`` itself.
    """
    args, env = [str(c) for c in cmd], environ() if env is None else env
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=capture, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    ran = Ran(args, Path(cwd or os.getcwd()), res.returncode, res.stdout, res.stderr, wall, cpu)
    if code is not None and ran.code != code:
        sys.exit(failure(ran))
    return ran


def commit(root: Path, message: str, **kw) -> None:
    """``git add -A`` and commit in ROOT, under a bench identity (a machine without a git user still commits)."""
    run(["git", "add", "-A"], root, **kw)
    run(
        ["git", "-c", "user.name=zg-bench", "-c", "user.email=zg-bench@localhost", "commit", "-qm", message], root, **kw
    )


def scaffold(root: Path, profile: str, *, message: str | None = "init", **kw) -> Path:
    """A project: ``zg init ROOT --profile PROFILE`` (this environment's zg), committed with MESSAGE unless None.
    KW go to ``run`` (env, capture)."""
    root = Path(root).resolve()
    root.parent.mkdir(parents=True, exist_ok=True)
    run([BIN / "zg", "init", root, "--profile", profile], root.parent, **kw)
    if message is not None:
        commit(root, message, **kw)
    return root


def params(root: Path, edit=None) -> dict:
    """ROOT's params.yaml, rewritten first by ``edit(params)`` when given (key order kept)."""
    import yaml

    path = Path(root) / "params.yaml"
    p = yaml.safe_load(path.read_text())
    if edit is not None:
        edit(p)
        path.write_text(yaml.safe_dump(p, sort_keys=False))
    return p


# ---------------------------------------------------------------------------------------------
# noise accounting: other people's processes share these cores


def busy_cpu_s() -> float:
    """Machine-wide busy CPU seconds (all cores) from /proc/stat; nan where unavailable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(v[:8]) - v[3] - v[4]) / hz  # user nice system idle iowait irq softirq steal


def own_cpu_s() -> float:
    """CPU seconds (user + sys) of this process so far."""
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """Wall time, this process's CPU time and everyone else's CPU time over a block.

    ``foreign`` is the share of the machine's cores that *other* processes used while the block ran: 0 is a quiet
    machine, 0.5 means they took half of it. Compare runs with low ``foreign`` (``wait_quiet`` first).
    """

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), busy_cpu_s(), own_cpu_s()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t
        own = own_cpu_s() - self.own
        foreign = max(busy_cpu_s() - self.busy - own, 0.0)
        ncpu = os.cpu_count() or 1
        self.own_util = own / self.wall / ncpu
        self.foreign = min(foreign / self.wall / ncpu, 1.0)  # /proc/stat ticks are 10 ms: short blocks are rough
        return False


def wait_quiet(threshold: float, timeout: float) -> float:
    """Wait until other processes use < THRESHOLD of the machine over a 2 s window (at most TIMEOUT seconds);
    returns that share."""
    end = time.perf_counter() + timeout
    while True:
        with CpuMeter() as m:
            time.sleep(2.0)
        if m.foreign < threshold or time.perf_counter() >= end:
            return m.foreign

"""The project files each DVC stage's command opened during a real `dvc repro`, from one strace of the whole run.

tests/test_stage_deps.py checks that every file a stage reads is one of its declared deps. Rather than run every
stage a second time under strace, the fixtures that reproduce a project anyway (``reproduced`` in tests/conftest.py,
through ``reproduce`` in tests/helpers/projects.py; ``searched`` in tests/zgtrain/search/test_search.py) run their
`dvc repro` under ``strace -ff`` (one log per process), and ``stage_opens`` attributes each open to the stage whose
command opened it: DVC runs a stage's ``cmd`` as ``SHELL -c CMD``, so the stage's processes are that shell and
everything it forks or clones (its threads, `zg`, the processes `zg` starts). DVC's own opens (hashing deps,
writing dvc.lock) belong to no stage.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

STRACE = shutil.which("strace") or ("/usr/bin/strace" if os.access("/usr/bin/strace", os.X_OK) else None)

# -ff: one log per process (no interleaved, split lines); -y: the path a returned descriptor names; -s: whole argv;
# -ttt: each line's time, to order the events of a stage's several processes
TRACE = ("-ff", "--seccomp-bpf", "-qq", "-y", "-s", "65536", "-ttt")
SYSCALLS = "trace=open,openat,openat2,mkdir,mkdirat,rename,renameat,renameat2,execve,clone,clone3,fork,vfork"

# `T openat(AT_FDCWD</cwd>, "name", O_RDONLY|O_CLOEXEC) = 3</abs/path>`: the flags and the opened path
# (failed opens return -1 and name no path)
_OPEN = re.compile(r"^([0-9.]+) open(?:at2?)?\(.*?, (O_[A-Z_|]+|\{flags=O_[A-Z_|]+)[,)}].*\s= \d+<(.*)>$")
# `T mkdirat(AT_FDCWD</cwd>, "name", 0777) = 0`, `T mkdir("name", 0777) = 0`: a folder the stage made
_MKDIR = re.compile(r'^([0-9.]+) mkdir(?:at)?\((?:[^"]*<(.*?)>, )?"(.*?)", .*\)\s+= 0$')
# `T renameat2(AT_FDCWD</cwd>, "old", AT_FDCWD</cwd>, "new", 0) = 0`, `T rename("old", "new") = 0`: the new name
_RENAME = re.compile(r'^([0-9.]+) rename(?:at2?)?\(.*"(?:, [^"]*<(.*?)>)?, "(.*?)"(?:, [A-Z_|0-9]+)?\)\s+= 0$')
# strace pads a short call to column 40 before its " = ": `T vfork()               = 10085` (dash, DVC's stage
# shell where SHELL is unset, as in CI, forks its command; bash execs it)
_CHILD = re.compile(r"^[0-9.]+ (?:clone3?|v?fork)\(.*\)\s+= (\d+)$")
WRITE_FLAGS = ("O_CREAT", "O_WRONLY", "O_TRUNC")


def traced_run(cmd: list[str], cwd: Path, log_dir: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd`` under strace, one log per process in ``log_dir`` (created)."""
    log_dir.mkdir(parents=True)
    return subprocess.run(
        [STRACE, *TRACE, "-e", SYSCALLS, "-o", str(log_dir / "p"), *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def repro(cmd: list[str], cwd: Path, log_dir: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a `dvc repro`) in ``cwd``, under strace into ``log_dir`` where strace is installed; it must
    succeed."""
    if STRACE:
        res = traced_run(cmd, cwd, log_dir)
    else:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def _logs(log_dir: Path) -> dict[int, list[str]]:
    return {int(p.name.split(".")[-1]): p.read_text(errors="replace").splitlines() for p in log_dir.glob("p.*")}


def _events(lines: list[str], root: str):
    """(time, absolute path, flags) of each successful open, mkdir (flags "mkdir") and rename (flags "rename":
    the new name) in one process's log; relative names are the project's (stages run in its root)."""
    for line in lines:
        if m := _OPEN.match(line):
            yield float(m.group(1)), m.group(3).removesuffix(" (deleted)"), m.group(2)
        elif m := _MKDIR.match(line) or _RENAME.match(line):
            where = m.group(2) or root
            yield float(m.group(1)), os.path.normpath(os.path.join(where, m.group(3))), line.split()[1].split("(")[0]


def stage_opens(log_dir: Path, root: Path, cmds: dict[str, str]) -> dict[str, dict[str, str]]:
    """{stage: {project path (relative, posix): what the stage first did with it}} for each stage name -> its
    ``cmd``: the flags of its first open (``O_RDONLY|O_CLOEXEC``...), or ``mkdir`` / ``rename`` (made it, or
    gave a file that name). A stage whose command never ran raises: the trace would say nothing about it."""
    logs = _logs(log_dir)
    children: dict[int, list[int]] = {}
    for pid, lines in logs.items():
        for line in lines:
            if m := _CHILD.match(line):
                children.setdefault(pid, []).append(int(m.group(1)))
    real = os.path.realpath(root)
    out = {}
    for name, cmd in cmds.items():
        needle = f'"-c", "{cmd}"]'
        shells = [pid for pid, lines in logs.items() if any(" execve(" in s and needle in s for s in lines)]
        if len(shells) != 1:
            raise AssertionError(f"stage {name}: {len(shells)} processes ran `{cmd}` in the trace (expected 1)")
        pids, todo = set(), list(shells)
        while todo:
            pid = todo.pop()
            if pid not in pids:
                pids.add(pid)
                todo.extend(children.get(pid, ()))
        first: dict[str, str] = {}
        for _, path, what in sorted(e for pid in pids for e in _events(logs.get(pid, ()), real)):
            if path.startswith(real + os.sep):
                first.setdefault(Path(os.path.relpath(path, real)).as_posix(), what)
        out[name] = first
    return out


def reads(opened: dict[str, str]) -> dict[str, bool]:
    """Of a stage's paths (``stage_opens``), those it read: {path: is it a folder}. A path that the stage first
    created, truncated, wrote, made (mkdir) or renamed a file to is its own (its outputs, their ``*.tmp`` and
    ``*.partial`` siblings); any other existed when the stage opened it."""
    return {
        p: "O_DIRECTORY" in f
        for p, f in opened.items()
        if f.startswith(("O_", "{flags=")) and not any(w in f for w in WRITE_FLAGS)
    }

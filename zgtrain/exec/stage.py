"""The stage function of a block and the `dvc` runner, shared by every way zg repro trains a block.

``train_one`` is what `zg train block KEY` does, as a plain function: zgtrain/exec/repro.py calls it in
its own process (``--jobs 1``), zgtrain/exec/ray_tasks.py runs it as a Ray task, and
zgtrain/exec/scratch.py calls it in a scratch clone of the project (``--data remote``). ``dvc`` runs a
DVC command with this interpreter's DVC for the driver and the scratch workers.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import ProjectConfig

__all__ = ["dvc", "dvc_logging", "train_one"]


@contextlib.contextmanager
def dvc_logging(level: int):
    """DVC's logger at LEVEL while DVC's Python API runs in this process (its CLI sets its own), then as it was."""
    import logging

    log = logging.getLogger("dvc")
    before = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(before)


def dvc(root: Path, *args: str, echo: bool = False) -> str:
    """Run `dvc ARGS` in ROOT with this interpreter's DVC; its output (echoed to stderr when ``echo``)."""
    cmd = [sys.executable, "-m", "dvc", *args]
    # a session of its own, so that stopping it reaches the stage command dvc runs too (dvc leaves it on SIGTERM)
    proc = subprocess.Popen(
        cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if echo and os.environ.get("ZG_QUIET") != "1":
                print(line, end="", file=sys.stderr, flush=True)
        rc = proc.wait()
    except BaseException:  # interrupted or terminated (zgtrain/cli.py): no dvc left running on its own
        _stop(proc)
        raise
    text = "".join(out)
    if rc:
        last = [ln for ln in text.splitlines() if ln.strip()][-3:]
        raise ZgError(
            f"`dvc {' '.join(args)}` failed in {root} (exit {rc}): {' | '.join(last)[:400]}",
            fix="fix what dvc says above, then rerun `zg repro` (recorded stages do not run again)",
        )
    return text


def _stop(proc: subprocess.Popen) -> None:
    """End a `dvc` child and the stage command it runs (its process group) so that dvc releases its locks: SIGINT
    to all, as Ctrl-C would (dvc ignores it while its command runs, then fails that stage and unwinds); after 30 s,
    SIGKILL to the command (dvc then unwinds); after 30 s more, SIGKILL to whatever is left."""
    import signal

    import psutil

    def wait(s: float) -> bool:
        try:
            proc.wait(timeout=s)
            return True
        except subprocess.TimeoutExpired:
            return False

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
        if wait(30):
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        if wait(30):
            return
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def _quiet():
    """The trainer's own progress bar off: zg repro shows every running block in one view instead."""
    old = os.environ.get("ZG_QUIET")
    os.environ["ZG_QUIET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ZG_QUIET", None)
        else:
            os.environ["ZG_QUIET"] = old


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def train_one(root: str | Path, key: str, report: Callable[[dict], None] | None = None) -> dict:
    """Train block KEY of the project at ROOT as `zg train block KEY` does (what every worker runs).

    An unfinished checkpoint of the same params resumes (a retried or rerun task continues); anything else
    starts afresh, as under `dvc repro`. A user error comes back as ``{"status": "failed", ...}`` rather
    than raised, so that the driver records the other blocks. ``report`` gets progress about once a second.
    """
    import torch

    from zgtrain.block.train import train_block

    layout = Layout(Path(root))
    where = {"host": socket.gethostname(), "pid": os.getpid()}
    t0, cpu0, last = time.monotonic(), time.process_time(), [0.0]
    try:
        project = ProjectConfig.load(layout.params)
        steps = project.block(key).train.steps

        def on_step(step: int, loss: float) -> None:
            now = time.monotonic()
            if report is not None and (now - last[0] >= 1.0 or step == steps):
                last[0] = now
                report({"key": key, "step": step, "steps": steps, "loss": loss, **where})

        if report is not None:
            report({"key": key, "step": None, "steps": steps, "loss": None, **where})
        with _quiet():
            r = train_block(project, key, restart="auto", layout=layout, on_step=on_step)
    except ZgError as e:
        return {"key": key, "status": "failed", "error": e.what, "error_key": e.key, "fix": e.fix, **where}
    return {
        **r.metrics(),
        **where,
        "threads": torch.get_num_threads(),
        "seconds": time.monotonic() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "peak_rss_mb": _peak_rss_mb(),
    }

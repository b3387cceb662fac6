"""Running the real `zg` CLI and other commands: ``zg`` (the installed script, a process of its own), ``zg_main``
(the CLI's ``main`` in this process, for tests of a stage), ``run`` (any command), and runs killed at an event
(``kill_9_when``, ``kill_after_first_checkpoint``).

Only the standard library is imported here at import time: tests/conftest.py imports this module before it sets
the environment (OMP_NUM_THREADS) that torch reads when it loads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent

__all__ = ["BIN", "zg", "zg_main", "run", "remember_fresh_threads", "kill_9_when", "kill_after_first_checkpoint"]


def zg(*args, cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run the real `zg` CLI in ``cwd``."""
    res = subprocess.run(
        [str(BIN / "zg"), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"zg {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


_FRESH_THREADS = None  # torch's CPU thread count in a fresh process of this machine (read before any test changes it)


def remember_fresh_threads() -> None:
    """Read torch's thread count of a fresh process (tests/conftest.py's ``pytest_configure``, before any test runs):
    each ``zg_main`` run starts from it."""
    global _FRESH_THREADS
    import torch

    _FRESH_THREADS = torch.get_num_threads()


def zg_main(*args, cwd, check=True, env=None) -> subprocess.CompletedProcess:
    """Run the `zg` CLI in this process, through ``zgtrain.cli.main`` (what the `zg` script, ``zgtrain.cli.run``,
    calls): the same result as ``zg`` (exit code, stdout, stderr; a bug's traceback in stderr with code 1) without
    starting an interpreter and importing torch again.

    For tests of a stage, not of the process boundary: kills, locks held by another process, DVC, Ray and
    environment-variable failpoints read at import keep ``zg``. What a run changes in this process is put
    back afterwards: the cwd, os.environ (cli.main sets HF_* variables, --debug sets ZG_DEBUG), torch's
    thread count (trainers set train.threads; each run starts from a fresh process's count, so its bits
    are a subprocess's) and the global random states of torch, numpy and random.
    """
    import contextlib
    import io
    import random
    import traceback

    import numpy as np
    import torch

    from zgtrain.cli import main

    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        os.chdir(cwd)
        torch.set_num_threads(_FRESH_THREADS)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    res = subprocess.CompletedProcess(["zg", *map(str, args)], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"zg {' '.join(map(str, args))} failed ({code}):\n{res.stdout}\n{res.stderr}")
    return res


def run(cmd: list[str], cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    res = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def kill_9_when(ready, args: list[str], cwd: Path, env: dict, stderr_path: Path, what: str) -> subprocess.Popen:
    """Run ``zg ARGS`` in CWD and `kill -9` it as soon as ``ready()`` is true (polled while it runs).

    WHAT names the awaited event in the failure messages; the run's stderr goes to STDERR_PATH."""
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([str(BIN / "zg"), *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 600  # a hang guard, not a timing assertion
            while not ready():
                assert proc.poll() is None, f"zg exited ({proc.returncode}) before {what}: {stderr_path.read_text()}"
                assert time.monotonic() < deadline, f"gave up waiting for {what}"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc


def kill_after_first_checkpoint(args: list[str], cwd: Path, meta_path: Path, stderr_path: Path) -> None:
    """Run ``zg ARGS`` in CWD and `kill -9` it once META_PATH records a step > 0 (a checkpoint), before it ends.

    ZG_FAILPOINT_SLEEP_AFTER_STEP (the trainers' test hook) sleeps after each optimizer step, so the kill lands
    after a checkpoint and before the run can finish. meta.json is replaced atomically, so a read sees it whole."""
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "zg"), *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.5"},
        )
        try:
            deadline = time.monotonic() + 300  # a guard against hanging, not a timing assertion
            while proc.poll() is None and time.monotonic() < deadline:
                if meta_path.exists() and json.loads(meta_path.read_text())["step"] > 0:
                    break
                time.sleep(0.01)
            assert proc.poll() is None, f"zg {' '.join(args)} exited before the kill (rc {proc.returncode})"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()  # when an assertion above failed; a second SIGKILL after ours is harmless
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

"""A `zg repro --jobs 2` driver killed with SIGKILL leaves no Ray process behind (zgdata/core/ray_reaper.py).

The driver starts its own local Ray instance (no --address) in a session of its own, so every process Ray
starts for it shares that session id: after the kill, none may remain. Real `zg`, `dvc` and Ray on the tiny
project; the kill lands while both blocks train on Ray workers (widened with ZG_FAILPOINT_SLEEP_AFTER_STEP).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.projects import copy_project, read_json
from tests.helpers.runners import BIN, run


def _in_session(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if int(line.split()[1]) == sid]


def _wait(cond, what: str, limit: float) -> None:
    deadline = time.monotonic() + limit  # a guard against hanging, not a timing assertion
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _started(root: Path, key: str) -> bool:
    p = root / "models" / "blocks" / key / "meta.json"
    try:
        return read_json(p).get("step", 0) > 0
    except (FileNotFoundError, ValueError):
        return False


@pytest.mark.long
def test_killed_driver_leaves_no_ray_process(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    for rel in ("models/blocks", "metrics/blocks", "plots/loss"):
        shutil.rmtree(root / rel)
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    lock["stages"] = {k: v for k, v in lock["stages"].items() if not k.startswith("train@")}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    shutil.rmtree(root / ".dvc" / "cache" / "runs")  # the run cache would restore the blocks, not train them
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "no blocks"], cwd=root)
    env = {k: v for k, v in os.environ.items() if k not in ("ZG_RAY_ADDRESS", "RAY_ADDRESS")}
    proc = subprocess.Popen(
        [str(BIN / "zg"), "repro", "train@b00", "train@b01", "--jobs", "2"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**env, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.3"},
    )
    try:
        _wait(
            lambda: _started(root, "b00") and _started(root, "b01") or proc.poll() is not None,
            "both blocks training on Ray",
            limit=600,
        )
        assert proc.poll() is None, f"zg repro ended first (rc {proc.returncode})"
        running = _in_session(proc.pid)
        assert any("raylet" in line for line in running) and any("ray::" in line for line in running), running
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _wait(lambda: not _in_session(proc.pid), "the killed driver's Ray processes to end", limit=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        for line in _in_session(proc.pid):  # never leave them to the next test
            os.kill(int(line.split()[0]), signal.SIGKILL)

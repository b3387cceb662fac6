"""OutputLocks (zgtrain/exec/dvc_locks.py) takes DVC's write locks on the paths it writes and read locks on the
paths it reads, not the other way round: another process holds them in a tiny DVC repository, and this one tries
DVC's own rwlock on them, as `dvc repro` would. The slow end-to-end proof with real `zg repro` and `dvc repro`
processes is tests/zgtrain/exec/test_one_engine.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runners import BIN, run

REPO = Path(__file__).resolve().parents[3]
BLOCK, BOUNDARY = "models/blocks/b00", "data/boundaries/h00.lance"

_HOLDER = """
import sys
from zgtrain.exec.dvc_locks import OutputLocks

locks = OutputLocks(sys.argv[1])
locks.hold("train@b00", [sys.argv[2]], read=[sys.argv[3]])
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
locks.close()
"""


def _dvc_lock(tmp: Path, *, read=(), write=()):
    """DVC's own rwlock, as `dvc repro` takes it for a stage that reads READ and writes WRITE."""
    from dvc.fs import localfs
    from dvc.rwlock import rwlock

    return rwlock(str(tmp), localfs, "dvc repro", list(map(str, read)), list(map(str, write)), False)


def test_a_held_group_write_locks_its_outputs_and_read_locks_its_inputs(tmp_path):
    """While another process holds ``hold("train@b00", [block dir], read=[boundary])``: DVC's rwlock file lists the
    block dir under write and the boundary under read, both as that process's; a DVC read of the block dir and a
    DVC write of the boundary are refused (LockError); a DVC read of the boundary goes on beside it."""
    from dvc.lock import LockError

    root = tmp_path / "proj"
    root.mkdir()
    run(["git", "init", "-q"], cwd=root)
    run([str(BIN / "dvc"), "init", "-q"], cwd=root)
    block, boundary, tmp = root / BLOCK, root / BOUNDARY, root / ".dvc" / "tmp"
    block.mkdir(parents=True)
    boundary.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root), BLOCK, BOUNDARY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline() == "held\n", holder.stderr.read()
        info = {"pid": holder.pid, "cmd": "zg repro"}
        lock = json.loads((tmp / "rwlock").read_text())
        assert lock == {"write": {str(block): info}, "read": {str(boundary): [info]}}

        with pytest.raises(LockError, match="is busy"):
            with _dvc_lock(tmp, read=[block]):
                pass
        with _dvc_lock(tmp, read=[boundary]):  # readers share
            assert json.loads((tmp / "rwlock").read_text())["read"][str(boundary)][0] == info
        with pytest.raises(LockError, match="is busy"):
            with _dvc_lock(tmp, write=[boundary]):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0, holder.stderr.read()
    assert json.loads((tmp / "rwlock").read_text()) == {}  # released with the group
    with _dvc_lock(tmp, write=[block, boundary]):
        pass

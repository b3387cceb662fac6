"""One engine at a time: a `dvc repro` started while `zg repro` trains a block is refused by DVC itself before it
deletes anything (zg repro holds DVC's write locks on the outputs of the blocks it trains, and read locks on their
inputs: zgtrain/exec/dvc_locks.py), a forced `dvc repro` of the stage that writes those inputs likewise, and `zg
repro` then finishes and records the block, with no traceback. Real `zg`,
`dvc` and `git` processes on a copy of the session's reproduced tiny project."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from tests.helpers.projects import copy_project, set_params, tree_sha256
from tests.helpers.runners import BIN, run


def _locked_by_zg(root) -> bool:
    try:
        lock = json.loads((root / ".dvc" / "tmp" / "rwlock").read_text())
    except (OSError, ValueError):
        return False
    return any("zg repro" in info["cmd"] for info in lock.get("write", {}).values())


@contextlib.contextmanager
def _held_zg_repro(root, tmp_path):
    """`zg repro --jobs 1` in ROOT, held after a step of its first block while the yielded gate file exists (its
    stderr in tmp_path/zg.err); yields (process, gate) once zg repro holds DVC's locks. Killed if still running."""
    gate = tmp_path / "hold"
    gate.touch()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ZG_FAILPOINT_HOLD_AFTER_STEP": str(gate)}
    with open(tmp_path / "zg.err", "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "zg"), "repro", "--jobs", "1"], cwd=root, stdout=subprocess.DEVNULL, stderr=err, env=env
        )
        try:
            deadline = time.monotonic() + 300  # a guard against hanging, not a timing assertion
            while proc.poll() is None and not _locked_by_zg(root) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None and _locked_by_zg(root), (tmp_path / "zg.err").read_text()
            yield proc, gate
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.long
def test_dvc_repro_during_zg_repro_is_refused_before_it_deletes_anything(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    set_params(root, {"blocks.b00.lr": 0.002})  # train@b00 (and what follows) is stale
    run(["git", "commit", "-qam", "b00 lr"], cwd=root)
    block = root / "models" / "blocks" / "b00"
    before = tree_sha256(block)
    # train@b00 waits after each step while the gate exists: zg repro cannot finish first
    with _held_zg_repro(root, tmp_path) as (proc, gate):
        other = run(["dvc", "repro"], cwd=root, check=False, env={"ZG_FAILPOINT_HOLD_AFTER_STEP": ""})
        after = tree_sha256(block)  # zg repro is held after a step: it has not swapped in its retrained block
        # nor can a stage rewrite what a block being trained reads (its boundaries: materialize's outputs)
        inputs = tree_sha256(root / "data" / "boundaries")
        rewrite = run(["dvc", "repro", "-f", "-s", "materialize"], cwd=root, check=False)
        assert tree_sha256(root / "data" / "boundaries") == inputs
        assert proc.poll() is None, "zg repro ended before the second engine was tried"
        gate.unlink()  # let zg repro go on
        assert other.returncode != 0
        said = other.stdout + other.stderr
        assert "is busy" in said and "zg repro" in said, said
        assert after == before  # dvc repro deleted nothing
        said = rewrite.stdout + rewrite.stderr
        assert rewrite.returncode != 0 and "is busy" in said and "zg repro" in said, said
        proc.wait(timeout=600)
    err_text = (tmp_path / "zg.err").read_text()
    assert proc.returncode == 0 and "Traceback" not in err_text, err_text
    assert not _locked_by_zg(root)
    assert "up to date" in run(["dvc", "status"], cwd=root).stdout


def _alive_under(root) -> list[str]:
    """Command lines of live processes working in ``root`` (zombies left out)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        if p.info["cwd"] == str(root) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(" ".join(p.info["cmdline"] or []))
    return out


def test_a_terminated_zg_repro_ends_the_dvc_it_started_and_its_stage(reproduced, tmp_path):
    """SIGTERM to `zg repro` while its `dvc repro materialize` runs the stage: the driver stops that dvc and the
    stage process under it as Ctrl-C would (a scheduler's stop used to leave both running, holding DVC's locks),
    exits non-zero without a traceback, and DVC's lock file holds no entry."""
    from tests.helpers.datasets import journal_rows

    root = copy_project(reproduced, tmp_path / "proj")
    set_params(root, {"materialize.codec": "zstd_fast"})  # materialize (and all after it) is stale
    run(["git", "commit", "-qam", "codec"], cwd=root)
    # materialize sleeps 3 s after each of its (up to 4) commits: the stop lands while it runs, and on Ctrl-C its
    # writer finishes within dvc's grace (zgtrain/exec/stage.py: SIGINT, then SIGKILL to the stage after 30 s)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ZG_FAILPOINT_SLEEP_AFTER_COMMIT": "3"}
    with open(tmp_path / "zg.err", "w") as err:
        proc = subprocess.Popen([str(BIN / "zg"), "repro", "--jobs", "1"], cwd=root, stderr=err, env=env)
        try:
            deadline = time.monotonic() + 300  # a guard against hanging, not a timing assertion
            while proc.poll() is None and journal_rows(root) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None and journal_rows(root) > 0, (tmp_path / "zg.err").read_text()
            assert any("materialize" in c for c in _alive_under(root))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
    deadline = time.monotonic() + 60  # the stage process ends on its own SIGTERM; a hang guard
    while _alive_under(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_under(root) == []
    assert "Traceback" not in (tmp_path / "zg.err").read_text()
    lock = json.loads((root / ".dvc" / "tmp" / "rwlock").read_text() or "{}")
    assert not lock.get("write") and not lock.get("read"), lock  # dvc released its locks on its way out


@pytest.mark.long
@pytest.mark.parametrize(("edit", "value"), [("seed", 1), ("blocks.b00.lr", 0.003)])
def test_params_edited_while_zg_repro_trains_a_block_are_named_and_the_block_is_not_recorded(
    reproduced, tmp_path, edit, value
):
    """params.yaml edited while `zg repro` trains b00 (held after a step): the block trained on the old params is
    not recorded in dvc.lock (the global seed's edit was never tested), the error names the key that changed (it
    named the block's own overrides whatever changed), and `dvc status` still calls train@b00 changed."""
    root = copy_project(reproduced, tmp_path / "proj")
    set_params(root, {"blocks.b00.lr": 0.002})  # train@b00 (and what follows) is stale
    run(["git", "commit", "-qam", "b00 lr"], cwd=root)
    with _held_zg_repro(root, tmp_path) as (proc, gate):
        set_params(root, {edit: value})
        gate.unlink()
        proc.wait(timeout=600)
    said = (tmp_path / "zg.err").read_text()
    assert proc.returncode not in (0, None) and "Traceback" not in said, said
    line = next(x for x in said.splitlines() if x.startswith("error: "))
    assert f"[{edit}]" in line and f"changed in params.yaml while zg repro trained it ({edit}); not recording" in line
    status = run(["dvc", "status", "train@b00"], cwd=root).stdout
    assert "train@b00" in status and "changed" in status, status

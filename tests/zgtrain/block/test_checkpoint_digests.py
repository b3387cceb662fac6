"""Checkpoints carry the digests their save wrote (meta.json ``checkpoint_sha256``) and are checked before a resume:
a damaged checkpoint of an unfinished block is named in one line, never resumed into a run that then blames the
learning rate. A finished block's no-op rerun reads no checkpoint and writes nothing, so a damaged checkpoint there
changes no metric."""

from __future__ import annotations

import json

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import tree_sha256
from tests.helpers.runners import zg_main


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last byte: tensor data, not the header
    path.write_bytes(bytes(data))


def _checkpoint(root):
    (c,) = sorted((root / "models" / "blocks" / "b00").glob("ckpt-*"))
    return c


def test_a_damaged_checkpoint_is_refused_before_a_resume(tiny_project):
    zg_main("train", "block", "b00", "--stop-after", "3", cwd=tiny_project)
    meta = json.loads((tiny_project / "models" / "blocks" / "b00" / "meta.json").read_text())
    c = _checkpoint(tiny_project)
    assert sorted(meta["checkpoint_sha256"]) == sorted(p.name for p in c.iterdir())
    _flip(c / "optimizer.safetensors")
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "optimizer.safetensors is not the file its save wrote", "--restart")
    assert "lr" not in line.split(". ", 1)[-1]  # the fix is the checkpoint's, not the learning rate's
    assert not (tiny_project / "metrics" / "blocks" / "b00.json").exists()
    zg_main("train", "block", "b00", "--restart", cwd=tiny_project)  # the fix it names works


def test_a_finished_blocks_rerun_reads_no_checkpoint_and_writes_nothing(tiny_project):
    first = json.loads(zg_main("train", "block", "b00", "--json", cwd=tiny_project).stdout)
    metrics = tiny_project / "metrics" / "blocks" / "b00.json"
    before, stat = metrics.read_bytes(), metrics.stat()
    _flip(_checkpoint(tiny_project) / "optimizer.safetensors")  # would change any figure recomputed from it
    folder = tree_sha256(tiny_project / "models" / "blocks" / "b00")
    again = json.loads(zg_main("train", "block", "b00", "--json", cwd=tiny_project).stdout)
    assert again == first
    assert metrics.read_bytes() == before and metrics.stat().st_mtime_ns == stat.st_mtime_ns
    assert tree_sha256(tiny_project / "models" / "blocks" / "b00") == folder

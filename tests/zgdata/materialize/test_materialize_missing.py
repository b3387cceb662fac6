"""Materialize writes only the boundaries that are missing or stale: after one boundary goes missing, a direct
`zg data materialize` rewrites that one (to the same bits) and leaves every other boundary's files as they were, so
the blocks trained on them stay valid. Assemble never reads a block folder that resolves outside the project."""

from __future__ import annotations

import json
import os
import shutil

import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.datasets import boundary_bits
from tests.helpers.projects import copy_project, tree_sha256
from tests.helpers.runners import zg_main


def test_one_missing_boundary_is_rewritten_alone(tiny_project):
    folder = tiny_project / "data" / "boundaries"
    before = boundary_bits(tiny_project)
    kept = {p.name: tree_sha256(p) for p in folder.glob("*.lance") if p.stem != "h02"}
    assert sorted(before) == ["h00", "h02", "h04"]
    shutil.rmtree(folder / "h02.lance")
    zg_main("data", "materialize", cwd=tiny_project)
    assert {p.name: tree_sha256(p) for p in folder.glob("*.lance") if p.stem != "h02"} == kept  # untouched
    after = boundary_bits(tiny_project)
    assert after["h02"]["fingerprint"] == before["h02"]["fingerprint"]
    assert torch.equal(after["h02"]["bits"], before["h02"]["bits"])
    res = zg_main("data", "materialize", "--json", cwd=tiny_project)  # now complete: nothing to do
    assert json.loads(res.stdout)["skipped"] is True


def test_assemble_refuses_a_block_folder_that_resolves_outside_the_project(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    outside = shutil.move(root / "models" / "blocks" / "b01", tmp_path / "elsewhere")
    os.symlink(outside, root / "models" / "blocks" / "b01")
    student = tree_sha256(root / "models" / "student")
    res = zg_main("train", "assemble", cwd=root, check=False)
    assert_user_error(res, "block b01's folder models/blocks/b01 resolves to", "outside")
    assert tree_sha256(root / "models" / "student") == student


def test_a_damaged_boundary_is_captured_again_not_called_up_to_date(reproduced, tmp_path):
    """One byte of h02's data file changed (same size): a direct `zg data materialize` called the boundary up to
    date (it read the manifest and the row count). Its bytes differ from dvc.lock's record and a row fails its
    checksum, so it is captured again, to the same bits; the other boundaries' files stay as they were. With no
    dvc.lock at all, the rows alone decide."""
    tiny_project = copy_project(reproduced, tmp_path / "proj")
    assert "data/boundaries/h02.lance" in (tiny_project / "dvc.lock").read_text()
    folder = tiny_project / "data" / "boundaries"
    before = boundary_bits(tiny_project)
    kept = {p.name: tree_sha256(p) for p in folder.glob("*.lance") if p.stem != "h02"}
    for lock in (True, False):
        if not lock:
            (tiny_project / "dvc.lock").unlink()
        data = max((folder / "h02.lance" / "data").glob("*.lance"), key=lambda p: p.stat().st_size)
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 3] ^= 0x40  # inside the values, far from the file's footer
        data.write_bytes(bytes(raw))
        res = zg_main("data", "materialize", "--json", cwd=tiny_project)
        assert json.loads(res.stdout)["skipped"] is False, res.stdout
        assert {p.name: tree_sha256(p) for p in folder.glob("*.lance") if p.stem != "h02"} == kept
        after = boundary_bits(tiny_project)
        assert torch.equal(after["h02"]["bits"], before["h02"]["bits"])
        res = zg_main("data", "materialize", "--json", cwd=tiny_project)  # intact now: nothing to do
        assert json.loads(res.stdout)["skipped"] is True


def test_a_boundary_with_rows_deleted_is_captured_again(tiny_project):
    """A complete boundary that lost rows (a Lance delete: a new, valid version) is not up to date: materialize
    captures it again, to the rows and bits it had."""
    import lance

    folder = tiny_project / "data" / "boundaries"
    before = boundary_bits(tiny_project)
    n = len(before["h02"]["seq_id"])
    lance.dataset(str(folder / "h02.lance")).delete(f"seq_id >= {int(before['h02']['seq_id'][n // 2])}")
    assert lance.dataset(str(folder / "h02.lance")).count_rows() < n
    res = zg_main("data", "materialize", "--json", cwd=tiny_project)
    assert json.loads(res.stdout)["skipped"] is False, res.stdout
    after = boundary_bits(tiny_project)
    assert torch.equal(after["h02"]["seq_id"], before["h02"]["seq_id"])
    assert torch.equal(after["h02"]["bits"], before["h02"]["bits"])

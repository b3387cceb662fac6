"""No path leaves the project: a symlinked output folder or a '..' in metadata is refused with one line."""

from __future__ import annotations

import json
import os

import pytest
from conftest import assert_user_error, tree_sha256, zg_main

from zgdata.errors import ZgError
from zgdata.paths_guard import inside


def test_inside_resolves_symlinks_and_dotdot(tmp_path):
    root, out = tmp_path / "proj", tmp_path / "out"
    (root / "models").mkdir(parents=True)
    out.mkdir()
    assert inside(root / "models" / "b00", root, what="x") == root / "models" / "b00"
    (root / "models" / "b01").symlink_to(out)
    for bad in (root / "models" / "b01", root / "models" / "b01" / "meta.json", root / "models" / ".." / ".."):
        with pytest.raises(ZgError, match=f"outside {root.resolve()}"):
            inside(bad, root, what="x")


def test_a_block_folder_symlinked_outside_the_project_is_refused_and_nothing_is_written_there(tiny_project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    before = tree_sha256(outside)
    (tiny_project / "models" / "blocks").mkdir(parents=True, exist_ok=True)
    os.symlink(outside, tiny_project / "models" / "blocks" / "b01")
    res = zg_main("train", "block", "b01", "--restart", cwd=tiny_project, check=False)
    assert_user_error(res, "block b01's folder models/blocks/b01 resolves to", "outside")
    assert tree_sha256(outside) == before and sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not any(p.name.startswith("b01") for p in (tiny_project / "models" / "blocks").iterdir() if p.name != "b01")


def test_a_checkpoint_name_that_leaves_the_block_folder_is_refused_before_any_weights_load(tiny_project, monkeypatch):
    zg_main("train", "block", "b00", "--stop-after", "1", cwd=tiny_project)
    meta_path = tiny_project / "models" / "blocks" / "b00" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["checkpoint"] = "../../.."
    meta_path.write_text(json.dumps(meta))

    from zgtrain.fit import checkpoint

    loaded = []
    monkeypatch.setattr(checkpoint, "_load_tensors", lambda path, key: loaded.append(path))
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "the checkpoint meta.json names,", "outside", "--restart")
    assert loaded == []

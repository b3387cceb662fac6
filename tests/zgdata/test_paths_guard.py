"""No path leaves the project: a symlinked output folder or a '..' in metadata is refused with one line."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import tree_sha256
from tests.helpers.runners import zg_main
from zgdata.core.atomic import atomic_path, replace_path, write_json, write_text
from zgdata.core.paths_guard import inside, output, project_root
from zgdata.errors import ZgError


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
    assert_user_error(res, "block-b01's output models/blocks/b01 resolves to", "outside")
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
    monkeypatch.setattr(checkpoint, "load_tensors", lambda path, key: loaded.append(path))
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "the checkpoint meta.json names,", "outside", "--restart")
    assert loaded == []


# --- every output: zgdata/core/atomic.py and the stage locks check where a write lands --------------------------


def _project(tmp_path):
    """A bare project root (params.yaml marks it) and a folder outside it holding one file."""
    root, outside = tmp_path / "proj", tmp_path / "outside"
    root.mkdir()
    (root / "params.yaml").write_text("seed: 0\n")
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    return root, outside


def test_project_root_is_the_nearest_marked_ancestor_of_the_unresolved_path(tmp_path):
    root, outside = _project(tmp_path)
    (root / "models").symlink_to(outside)
    assert project_root(root / "models" / "student" / "x") == root  # found through the link, not beyond it
    assert project_root(outside / "x") is None
    assert output(outside / "x") == outside / "x"  # outside any project: not zg's to judge


def test_an_output_folder_symlinked_outside_is_refused_and_nothing_is_written_there(tmp_path):
    root, outside = _project(tmp_path)
    (root / "metrics").symlink_to(outside)
    (root / "models").mkdir()
    (root / "models" / "student").symlink_to(outside, target_is_directory=True)
    before = tree_sha256(outside)
    with pytest.raises(ZgError, match=f"output metrics/eval.json resolves to .*, outside {root.resolve()}"):
        with contextlib.chdir(root):
            write_json(Path("metrics") / "eval.json", {"ce": 1.0})
    with pytest.raises(ZgError, match="outside"):
        with atomic_path(root / "models" / "student") as tmp:
            tmp.mkdir()
    src = root / "new"
    src.mkdir()
    with pytest.raises(ZgError, match="outside"):
        replace_path(src, root / "metrics" / "h05.lance")
    with pytest.raises(ZgError, match="outside"):  # a '..' that climbs out of the project
        write_text(root / "metrics" / ".." / ".." / "escaped.txt", "x")
    assert tree_sha256(outside) == before and sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "escaped.txt").exists() and src.is_dir()


def test_links_that_stay_inside_and_file_links_into_a_dvc_cache_elsewhere_still_work(tmp_path):
    root, outside = _project(tmp_path)
    (root / "real_metrics").mkdir()
    (root / "metrics").symlink_to(root / "real_metrics")  # a folder link inside the project
    write_json(root / "metrics" / "eval.json", {"ce": 1.0})
    assert json.loads((root / "real_metrics" / "eval.json").read_text()) == {"ce": 1.0}
    write_text(root / "models" / ".." / "metrics" / "x.txt", "y")  # a '..' that stays inside
    assert (root / "real_metrics" / "x.txt").read_text() == "y"
    # DVC's symlink cache type, cache.dir outside the project: a workspace file links into the cache. It is
    # read as an input, and an output in its place is replaced, never written through.
    cache = outside / "files" / "md5" / "ab" / "cdef"
    cache.parent.mkdir(parents=True)
    cache.write_text('{"old": 1}\n')
    (root / "reports").mkdir()
    (root / "reports" / "verify.json").symlink_to(cache)
    assert json.loads((root / "reports" / "verify.json").read_text()) == {"old": 1}
    write_json(root / "reports" / "verify.json", {"new": 2})
    assert not (root / "reports" / "verify.json").is_symlink() and cache.read_text() == '{"old": 1}\n'


def test_a_boundaries_folder_symlinked_outside_is_refused_before_materialize_does_anything(tiny_project, tmp_path):
    outside = tmp_path / "outside"
    shutil.move(tiny_project / "data" / "boundaries", outside)
    before = tree_sha256(outside)
    (tiny_project / "data" / "boundaries").symlink_to(outside)
    res = zg_main("data", "materialize", cwd=tiny_project, check=False)
    assert_user_error(res, "materialize's output data/boundaries resolves to", "outside", "remove the symlink")
    assert tree_sha256(outside) == before
    assert not any((tiny_project / "data" / ".staging").glob("*"))


def test_a_reports_folder_symlinked_outside_is_refused_and_nothing_is_written_there(tiny_project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(tiny_project / "reports", ignore_errors=True)
    (tiny_project / "reports").symlink_to(outside)
    res = zg_main("data", "verify", cwd=tiny_project, check=False)  # no lock: zgdata/core/atomic.py's check
    assert_user_error(res, "output reports/verify.json resolves to", "outside")
    assert list(outside.iterdir()) == []


def test_zg_state_symlinked_outside_is_refused_before_a_lock_file_is_opened_there(tiny_project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    shutil.rmtree(tiny_project / ".zg", ignore_errors=True)
    (tiny_project / ".zg").symlink_to(outside)
    res = zg_main("data", "materialize", cwd=tiny_project, check=False)
    assert_user_error(res, "materialize's output .zg/locks/materialize.lock resolves to", "outside")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"] and (outside / "keep.txt").read_text() == "mine"


def test_a_boundaries_folder_symlinked_inside_the_project_still_works(tiny_project):
    real = tiny_project / "data" / "boundaries_real"
    shutil.move(tiny_project / "data" / "boundaries", real)
    (tiny_project / "data" / "boundaries").symlink_to(real)
    before = tree_sha256(real)
    zg_main("data", "materialize", cwd=tiny_project)  # up to date: read through the link, nothing rewritten
    assert tree_sha256(real) == before


def test_a_spill_folder_symlinked_outside_is_refused_and_one_inside_is_replaced(tiny_project, tmp_path):
    """data/.tokens.lance.spill, tokenize's scratch folder: a planted link outside is one line, and nothing is
    written or removed there; a link inside the project is dropped (its target kept) and tokenize runs."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    spill = tiny_project / "data" / ".tokens.lance.spill"
    spill.symlink_to(outside)
    shutil.rmtree(tiny_project / "data" / "tokens.lance")  # so that tokenize runs
    res = zg_main("data", "tokenize", cwd=tiny_project, check=False)
    assert_user_error(res, "spill folder data/.tokens.lance.spill resolves to", "outside")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    spill.unlink()
    target = tiny_project / "elsewhere"
    target.mkdir()
    spill.symlink_to(target)
    zg_main("data", "tokenize", cwd=tiny_project)
    assert target.is_dir() and not spill.exists()


def _folders(tmp_path, old: Path) -> Path:
    """``old`` holding old rows, and a new folder to publish (returned)."""
    old.mkdir(parents=True)
    (old / "a.lance").write_bytes(b"old rows")
    src = tmp_path / "new.lance"
    src.mkdir()
    (src / "b.lance").write_bytes(b"new rows")
    return src


def test_a_replace_killed_between_its_renames_leaves_no_old_copy_after_the_next_one(tmp_path):
    """replace_path renames the old folder aside, the new one in, then removes the old one: a kill between the
    renames leaves ``.NAME.old`` and no NAME. The next replace (materialize's rerun publishing the boundary) took the
    plain branch and left the old copy for good (a whole boundary's bytes nothing tracks); it is removed now."""
    dst = tmp_path / "data" / "boundaries" / "h00.lance"
    replace_path(_folders(tmp_path, dst.with_name(".h00.lance.old")), dst)
    assert sorted(p.name for p in dst.parent.iterdir()) == ["h00.lance"]
    assert (dst / "b.lance").read_bytes() == b"new rows"


def test_replacing_a_directory_leaves_only_the_new_one(tmp_path):
    """The old directory, renamed aside to ``.NAME.old`` during the swap, is removed once the new one is in."""
    dst = tmp_path / "out" / "h00.lance"
    replace_path(_folders(tmp_path, dst), dst)
    assert sorted(x.name for x in dst.parent.iterdir()) == ["h00.lance"]
    assert sorted(x.name for x in dst.iterdir()) == ["b.lance"]
    assert (dst / "b.lance").read_bytes() == b"new rows"


def test_a_link_to_a_sibling_whose_name_starts_with_the_roots_name_is_outside(tmp_path):
    """``p/out -> ../p2`` leaves the project ``p``: containment compares path components, not string prefixes."""
    root, sibling = tmp_path / "p", tmp_path / "p2"
    root.mkdir()
    (root / "params.yaml").write_text("{}\n")
    sibling.mkdir()
    (root / "out").symlink_to(sibling)
    for bad in (root / "out", root / "out" / "f.json"):
        with pytest.raises(ZgError, match=f"outside {root.resolve()}"):
            inside(bad, root, what="x")
        with pytest.raises(ZgError, match=f"outside {root.resolve()}"):
            output(bad, what="x")
    with pytest.raises(ZgError, match="outside"):
        write_text(root / "out" / "f.json", "{}")
    assert list(sibling.iterdir()) == []

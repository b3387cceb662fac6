"""`zg export --out` never destroys: a command-line path may be anywhere, inside the project or outside it, but an
export replaces only a previous export of zg. The project root, a folder above it, `.git`, `.dvc`, DVC-tracked data
and git-tracked files are refused in one line with everything intact; `export.out` in params is held to the same
folders (zgtrain/export/target.py, ExportConfig)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.models import make_student
from tests.helpers.projects import copy_project, read_json, set_params
from tests.helpers.runners import run, zg_main


def tree_digest(root: Path) -> str:
    """One sha256 over every file's relative path and bytes under ROOT (links by their target): a folder intact.
    zg's own lock and cache files (``.zg/``) are left out."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if ".zg" in p.relative_to(root).parts:
            continue
        h.update(str(p.relative_to(root)).encode())
        if p.is_symlink():
            h.update(str(p.readlink()).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def project(reproduced, tmp_path):
    return copy_project(reproduced, tmp_path / "proj")


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("data", "holds DVC-tracked data (data/tokens.lance"),
        ("models/teacher", "holds DVC-tracked data (models/teacher/hf"),
        ("models/blocks/b00", "is inside DVC-tracked data (models/blocks, in dvc.yaml (stage train)"),
        ("models/student/x", "overlaps the student folder"),
        (".git", "inside .git/"),
        (".dvc/cache", "inside .dvc/"),
        (".", "the project folder or a folder above it"),
        ("..", "the project folder or a folder above it"),
        ("params.yaml", "holds files git tracks"),
        ("models", "holds DVC-tracked data (models/teacher/hf"),
    ],
)
def test_out_over_the_projects_own_files_is_refused_with_them_intact(project, out, says):
    target = (project / out).resolve()
    target = target if target.exists() else target.parent  # a new path: the folder it would land in
    before = tree_digest(target) if target.is_dir() else target.read_bytes()
    head = run(["git", "rev-parse", "HEAD"], cwd=project).stdout
    res = zg_main("export", "student", "--out", out, cwd=project, check=False)
    assert_user_error(res, "--out", says)
    assert (tree_digest(target) if target.is_dir() else target.read_bytes()) == before
    assert run(["git", "rev-parse", "HEAD"], cwd=project).stdout == head  # the repository is whole
    assert not (project / "models" / "export").exists()


def test_an_export_outside_the_project_replaces_only_a_previous_export(project, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = home / "models" / "student-hf"
    res = zg_main("export", "student", "--out", "~/models/student-hf", "--json", cwd=project, env={"HOME": str(home)})
    r = json.loads(res.stdout)
    assert Path(r["path"]) == out and r["record"] == str(out / "export.json")
    record = read_json(out / "export.json")
    assert record["student"] == "models/student" and set(record["files"]) <= {p.name for p in out.iterdir()}
    zg_main("export", "student", "--out", str(out), cwd=project)  # its own previous export: replaced
    assert read_json(out / "export.json")["student_sha256"] == record["student_sha256"]

    (out / "notes.txt").write_text("mine")  # now the folder holds a file no export wrote
    before = tree_digest(out)
    assert_user_error(
        zg_main("export", "student", "--out", str(out), cwd=project, check=False), "not a previous export of zg"
    )
    assert tree_digest(out) == before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert_user_error(
        zg_main("export", "student", "--out", str(mine), cwd=project, check=False), "not a previous export of zg"
    )
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_gguf_to_a_file_path_anywhere_with_its_record_beside_it(tmp_path):
    student = make_student(tmp_path / "student", "llama", [32, 32], keep=[0, 1])
    home = tmp_path / "home"
    home.mkdir()
    out = home / "anywhere" / "model.gguf"
    res = zg_main(
        "export",
        str(student),
        "--format",
        "gguf",
        "--out",
        "~/anywhere/model.gguf",
        "--json",
        cwd=tmp_path,
        env={"HOME": str(home)},
    )
    r = json.loads(res.stdout)
    record = read_json(home / "anywhere" / "model.gguf.export.json")
    assert out.is_file() and r["path"] == str(out) and r["files"] == record["files"]
    assert record["files"] == {"model.gguf": hashlib.sha256(out.read_bytes()).hexdigest()}
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf", "model.gguf.export.json"]
    zg_main("export", str(student), "--format", "gguf", "--out", str(out), cwd=tmp_path)  # replaced: zg's own

    out.write_bytes(out.read_bytes() + b"\0")  # no longer the file its record names
    before = out.read_bytes()
    res = zg_main("export", str(student), "--format", "gguf", "--out", str(out), cwd=tmp_path, check=False)
    assert_user_error(res, "is a file that is not a previous export of zg")
    assert out.read_bytes() == before

    # the record's place beside a new .gguf is held to the same rule: a user's file there stays, a folder there
    # is refused before anything is written (it was overwritten, or the export ended in a traceback beside a .gguf)
    other = home / "other" / "m.gguf"
    other.parent.mkdir()
    side = other.with_name("m.gguf.export.json")
    for make, what in ((lambda: side.write_text("precious\n"), "a file"), (lambda: side.mkdir(), "a folder")):
        make()
        res = zg_main("export", str(student), "--format", "gguf", "--out", str(other), cwd=tmp_path, check=False)
        assert_user_error(res, f"m.gguf.export.json, where the export of --out {other} writes its record, is {what}")
        assert not other.exists() and (side.is_dir() or side.read_text() == "precious\n")
        side.unlink() if side.is_file() else side.rmdir()
    # a record left behind by a deleted export is zg's own: replaced
    zg_main("export", str(student), "--format", "gguf", "--out", str(other), cwd=tmp_path)
    other.unlink()
    zg_main("export", str(student), "--format", "gguf", "--out", str(other), cwd=tmp_path)
    assert read_json(side)["files"] == {"m.gguf": hashlib.sha256(other.read_bytes()).hexdigest()}


def test_a_previous_export_holds_only_plain_files(tmp_path):
    """A folder is a previous export of zg (``is_export``: replaced as a whole) only when every file its record
    lists is a plain file: a recorded name that is a link (to data the user holds elsewhere) or a folder is not
    zg's to replace, even with the record's names all present."""
    from zgtrain.export.target import RECORD, is_export

    def folder(name: str) -> Path:
        out = tmp_path / name
        out.mkdir()
        files = {"config.json": b"{}", "model.safetensors": b"weights"}
        for n, data in files.items():
            (out / n).write_bytes(data)
        record = {"files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}, "student_sha256": "s"}
        (out / RECORD).write_text(json.dumps(record))
        return out

    assert is_export(folder("plain"))
    linked = folder("linked")
    (tmp_path / "mine.json").write_text("{}")
    (linked / "config.json").unlink()
    (linked / "config.json").symlink_to(tmp_path / "mine.json")
    assert not is_export(linked)
    nested = folder("nested")
    (nested / "model.safetensors").unlink()
    (nested / "model.safetensors").mkdir()
    assert not is_export(nested)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("models/teacher", "which is models/teacher/"),
        ("data/x", "which is inside data/"),
        ("models", "which holds models/teacher/"),
        (".git/x", "git's and DVC's own"),
        (".", "git's and DVC's own"),
    ],
)
def test_export_out_in_params_stays_out_of_the_stages_folders(project, value, says):
    set_params(project, {"export.enabled": True, "export.out": value})
    before = (project / "dvc.yaml").read_text()
    assert_user_error(zg_main("pipeline", cwd=project, check=False), "export.out", says)
    assert (project / "dvc.yaml").read_text() == before

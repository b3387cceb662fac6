"""Weights are checked against their recorded identity on every load, and a no-op rerun changes no file.

Block weights against meta.json's ``weights_sha256`` (zgtrain/fit/checkpoint.py), the student folder against
its checksums.json (zgtrain/student/load.py), teacher.json against the digest of its content the teacher stage
recorded in it (``content_sha256``, zgdata/teacher/prepare.py). The damage is real bytes flipped or edited on disk.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.student.load import CHECKSUMS, load_student


@pytest.fixture(scope="module")
def assembled(tiny_built, tmp_path_factory):
    """The tiny project with both blocks trained briefly (2 steps) and the student assembled."""
    root = copy_project(tiny_built, tmp_path_factory.mktemp("identity") / "proj")
    set_params(root, {"train.steps": 2, "train.warmup": 1, "train.checkpoint_every": 0})
    for key in ("b00", "b01"):
        zg_main("train", "block", key, cwd=root)
    zg_main("train", "assemble", cwd=root)
    return root


@pytest.fixture
def project(assembled, tmp_path):
    return copy_project(assembled, tmp_path / "proj")


def _flip_tail(path, n: int = 16) -> None:
    """XOR the last ``n`` bytes: tensor data, so the file still parses and only a digest can tell."""
    data = bytearray(path.read_bytes())
    data[-n:] = bytes(b ^ 0xFF for b in data[-n:])
    path.write_bytes(bytes(data))


def _outputs(root) -> dict:
    return {d: tree_sha256(root / d) for d in ("models", "metrics", "plots") if (root / d).exists()}


def test_noop_rerun_of_a_finished_block_changes_no_file(project):
    before = _outputs(project)
    zg_main("train", "block", "b01", cwd=project)
    assert _outputs(project) == before


def test_flipped_block_weights_are_refused_by_assemble_and_training(project):
    layout = Layout(project)
    _flip_tail(layout.block_dir("b01") / "model.safetensors")
    before = _outputs(project)
    assert_user_error(
        zg_main("train", "assemble", cwd=project, check=False),
        "models/blocks/b01/model.safetensors",
        "dvc checkout --force models/blocks/b01",
    )
    assert_user_error(zg_main("train", "block", "b01", cwd=project, check=False), "b01/model.safetensors")
    assert _outputs(project) == before  # metrics not rewritten, student not replaced


def test_flipped_student_weights_are_refused_by_evaluate(project):
    _flip_tail(Layout(project).student / "model.safetensors")
    assert_user_error(
        zg_main("train", "evaluate", cwd=project, check=False), "models/student/model.safetensors", CHECKSUMS
    )
    assert not Layout(project).eval_metrics.exists()


def test_edited_teacher_json_is_refused_by_evaluate(project):
    path = Layout(project).teacher_json
    meta = json.loads(path.read_text())
    assert meta["dtype"] == "float32"
    path.write_text(json.dumps({**meta, "dtype": "bfloat16"}, indent=2))
    assert_user_error(zg_main("train", "evaluate", cwd=project, check=False), "teacher.json", "dvc checkout")
    assert not Layout(project).eval_metrics.exists()


def test_a_student_without_checksums_is_refused_with_how_to_re_record_it(project, tmp_path):
    """Fail closed: a folder that records no weights digests (an older zg's) is not read unchecked."""
    old = tmp_path / "old-student"
    shutil.copytree(Layout(project).student, old)
    (old / CHECKSUMS).unlink()
    with pytest.raises(ZgError, match="checksums.json is missing.*dvc repro -f assemble"):
        load_student(old)


def test_a_weights_file_checksums_json_does_not_list_is_refused_by_name(assembled, tmp_path):
    """Every ``*.safetensors`` in the folder must be one checksums.json records: an extra copy of the weights under
    another name (a file transformers might read, which no digest covers) is refused, naming it."""
    folder = tmp_path / "student"
    shutil.copytree(Layout(assembled).student, folder)
    assert list(json.loads((folder / CHECKSUMS).read_text())) == ["model.safetensors"]
    shutil.copyfile(folder / "model.safetensors", folder / "extra.safetensors")
    with pytest.raises(ZgError, match=r"extra\.safetensors is not the weights file zg wrote") as e:
        load_student(folder)
    assert "\n" not in str(e.value)

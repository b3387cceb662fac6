"""Every artifact a stage reads is checked against what git's dvc.lock records, not only against the digests
beside it: a remote-only attacker who rewrites a student's weights and its checksums.json, a block's weights and
its meta.json digest, or the teacher's teacher.json with a recomputed content digest, is refused in one line by
the stage that reads it, and nothing is written. (Boundaries, slices and the token set: tests/zgdata/test_trust.py.)"""

from __future__ import annotations

import json

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.core.hashing import file_sha256


@pytest.fixture
def project(reproduced, tmp_path):
    return copy_project(reproduced, tmp_path / "proj")


def _rewrite_weights(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_student_rewritten_with_its_checksums_is_refused_by_evaluate_and_export(project):
    student = project / "models" / "student"
    _rewrite_weights(student / "model.safetensors")
    sums = json.loads((student / "checksums.json").read_text())
    sums["model.safetensors"] = file_sha256(student / "model.safetensors")  # the digest beside it, recomputed
    (student / "checksums.json").write_text(json.dumps(sums))
    metrics = (project / "metrics" / "eval.json").read_bytes()
    res = zg_main("train", "evaluate", cwd=project, check=False)
    assert_user_error(res, "models/student", "does not match dvc.lock", "dvc checkout")
    assert (project / "metrics" / "eval.json").read_bytes() == metrics
    res = zg_main("export", "student", cwd=project, check=False)
    assert_user_error(res, "models/student", "does not match dvc.lock")
    assert not (project / "models" / "export").exists()


def test_a_block_rewritten_with_its_meta_digest_is_refused_by_assemble(project):
    block = project / "models" / "blocks" / "b01"
    _rewrite_weights(block / "model.safetensors")
    meta = json.loads((block / "meta.json").read_text())
    meta["weights_sha256"] = file_sha256(block / "model.safetensors")
    (block / "meta.json").write_text(json.dumps(meta))
    student = tree_sha256(project / "models" / "student")
    res = zg_main("train", "assemble", cwd=project, check=False)
    assert_user_error(res, "models/blocks/b01", "does not match dvc.lock")
    assert tree_sha256(project / "models" / "student") == student


def test_a_teacher_json_with_a_recomputed_digest_is_refused_by_materialize_and_evaluate(project):
    from zgdata.teacher.prepare import DIGEST, canonical_json, sha256_bytes

    path = project / "models" / "teacher" / "teacher.json"
    meta = json.loads(path.read_text())
    meta["source"] = "another-teacher"
    meta[DIGEST] = sha256_bytes(canonical_json({k: v for k, v in meta.items() if k != DIGEST}).encode())
    path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    boundaries = tree_sha256(project / "data" / "boundaries")
    for cmd in (("data", "materialize"), ("train", "evaluate")):
        res = zg_main(*cmd, cwd=project, check=False)
        assert_user_error(res, "models/teacher/teacher.json", "does not match dvc.lock")
    assert tree_sha256(project / "data" / "boundaries") == boundaries


def test_a_missing_digest_record_is_a_refusal_that_says_how_to_re_record(project):
    """Fail closed: where dvc.lock records nothing (a project run without DVC), a student without checksums.json, a
    finished block whose meta.json records no weights digest and a teacher.json without its content digest (folders
    of an older zg) are refused, each naming its re-record command, instead of being read unchecked."""
    from zgdata.errors import ZgError
    from zgdata.layout import Layout
    from zgdata.teacher.prepare import read_teacher_json
    from zgtrain.block.load import load_block

    (project / "dvc.lock").unlink()  # nothing recorded in git: the digests beside the files are all there is
    (project / "models" / "student" / "checksums.json").unlink()
    res = zg_main("train", "evaluate", cwd=project, check=False)
    assert_user_error(res, "checksums.json is missing", "dvc repro -f assemble")
    meta_path = project / "models" / "blocks" / "b00" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["weights_sha256"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ZgError, match="records no weights_sha256"):
        load_block(Layout(project), "b00")
    path = project / "models" / "teacher" / "teacher.json"
    teacher = json.loads(path.read_text())
    del teacher["content_sha256"]
    path.write_text(json.dumps(teacher))
    with pytest.raises(ZgError, match="records no content_sha256"):
        read_teacher_json(Layout(project))

"""`zg export` on a student the pipeline assembled (the session's ``reproduced`` tiny project, copied): the stock
folder and its lineage (export.json, the card), the one-line refusals of bad input, and the optional `export`
DVC stage (`export.enabled`) run by a real `dvc repro`, after which `dvc status` is clean."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, read_json, set_params
from tests.helpers.runners import run, zg_main
from zgdata.layout import Layout


@pytest.fixture
def project(reproduced, tmp_path):
    return copy_project(reproduced, tmp_path / "proj")


def test_export_writes_a_stock_folder_with_its_lineage(project):
    from transformers import AutoModelForCausalLM

    from zgtrain.student.load import load_student, student_sha256

    layout = Layout(project)
    res = zg_main("export", "student", "--json", cwd=project)
    r = json.loads(res.stdout)
    out = project / "models" / "export" / "student-f32"
    assert r["path"] == "models/export/student-f32" and r["format"] == "hf" and r["dtype"] == "f32"
    record = read_json(out / "export.json")
    teacher = read_json(layout.teacher_json)
    assert record["student"] == "models/student" and record["student_sha256"] == student_sha256(layout.student)
    assert (
        record["teacher_sha256"]
        == teacher["weights_sha256"]
        == read_json(layout.student / "zerograph.json")["teacher_sha256"]
    )
    assert record["tokenizer_sha256"] == teacher["tokenizer_sha256"] and "tokenizer.json" in record["tokenizer_files"]
    assert record["files"] == r["files"] and record["zg_version"]
    for name, sha in record["files"].items():
        assert __import__("hashlib").sha256((out / name).read_bytes()).hexdigest() == sha, name
    card = (out / "README.md").read_text()
    assert "## Export" in card and record["student_sha256"] in card and "trust_remote_code" in card
    got = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False, dtype=torch.float32).eval()
    want = load_student(layout.student)
    ids = torch.arange(40).reshape(2, 20) % got.config.vocab_size
    with torch.no_grad():
        assert torch.equal(got(input_ids=ids).logits, want(input_ids=ids).logits)


def test_bad_input_is_refused_with_one_line_and_nothing_written(project):
    exports = project / "models" / "export"
    assert_user_error(zg_main("export", "models/nowhere", cwd=project, check=False), "no student folder")
    assert_user_error(zg_main("export", "repaired", cwd=project, check=False), "repair.steps")
    teacher_hf = str(Layout(project).teacher_hf)
    assert_user_error(zg_main("export", teacher_hf, cwd=project, check=False), "is not a zg student")
    assert_user_error(zg_main("export", "--format", "onnx", cwd=project, check=False), "--format onnx")
    assert_user_error(zg_main("export", "--dtype", "f8", cwd=project, check=False), "--dtype f8")
    assert_user_error(zg_main("export", "--dtype", "q8_0", cwd=project, check=False), "--format gguf")
    assert_user_error(
        zg_main("export", "student", "--out", "models/student/x", cwd=project, check=False), "overlaps the student"
    )
    tampered = shutil.copytree(project / "models" / "student", project / "models" / "tampered")
    data = bytearray((tampered / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (tampered / "model.safetensors").write_bytes(bytes(data))
    assert_user_error(zg_main("export", "models/tampered", cwd=project, check=False), "not the weights file zg wrote")
    assert not exports.exists()


def test_gguf_goes_to_the_gguf_writer(project):
    """--format gguf dispatches to zgtrain/export/gguf.py (its own tests: test_gguf.py): <out>/<name>.gguf and
    export.json beside it, or its one-line refusal with nothing written."""
    res = zg_main("export", "student", "--format", "gguf", "--json", cwd=project, check=False)
    out = project / "models" / "export" / "student-f16"
    if res.returncode == 0:
        record = read_json(out / "export.json")
        assert record["format"] == "gguf" and record["dtype"] == "f16" and "student.gguf" in record["files"]
    else:
        assert_user_error(res)
        assert not out.exists()


@pytest.mark.long
def test_export_stage_runs_under_dvc_only_when_enabled(project):
    before = (project / "dvc.yaml").read_text()
    zg_main("pipeline", cwd=project)
    assert (project / "dvc.yaml").read_text() == before  # no export: section, no export stage
    set_params(project, {"export.enabled": True, "export.dtype": "bf16"})
    zg_main("pipeline", cwd=project)
    stage = __import__("yaml").safe_load((project / "dvc.yaml").read_text())["stages"]["export"]
    assert stage["cmd"] == "zg export student --format hf --dtype bf16 --out models/export/student-bf16"
    run(["dvc", "repro", "export"], cwd=project)
    out = project / "models" / "export" / "student-bf16"
    record = read_json(out / "export.json")
    assert record["dtype"] == "bf16" and record["student"] == "models/student"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    status = run(["dvc", "status"], cwd=project)
    assert "up to date" in status.stdout, status.stdout
    lock = __import__("yaml").safe_load((project / "dvc.lock").read_text())["stages"]["export"]
    assert [o["path"] for o in lock["outs"]] == ["models/export/student-bf16"]
    # `zg init`'s .gitignore keeps every export out of git, the stage's and a by-hand `zg export`'s alike
    zg_main("export", "student", cwd=project)
    for f in ("models/export/student-bf16/config.json", "models/export/student-f32/model.safetensors"):
        assert run(["git", "check-ignore", "-q", f], cwd=project, check=False).returncode == 0, f


def test_the_record_names_the_projects_teacher_only_when_it_is_the_students(tmp_path):
    """export.json's teacher source and tokenizer digest come from the project's teacher.json only where that
    teacher is the student's own (its weights_sha256 is the student's teacher_sha256): a project that now holds
    teacher B records neither for a student of teacher A, rather than naming B's."""
    from zgtrain.export.run import _lineage

    student = tmp_path / "student"
    student.mkdir()
    (student / "zerograph.json").write_text(json.dumps({"family": "llama", "teacher_sha256": "a" * 64}))
    (student / "tokenizer.json").write_text("{}")
    layout = Layout(tmp_path / "proj")
    layout.teacher_json.parent.mkdir(parents=True)
    b = {"weights_sha256": "b" * 64, "source": "teachers/b", "tokenizer_sha256": "2" * 64}
    layout.teacher_json.write_text(json.dumps(b))
    got = _lineage(student, layout)
    assert got["teacher_sha256"] == "a" * 64 and got["family"] == "llama"
    assert got["teacher_source"] is None and got["tokenizer_sha256"] is None
    assert set(got["tokenizer_files"]) == {"tokenizer.json"}
    a = {"weights_sha256": "a" * 64, "source": "teachers/a", "tokenizer_sha256": "1" * 64}
    layout.teacher_json.write_text(json.dumps(a))  # the student's own teacher: named
    got = _lineage(student, layout)
    assert got["teacher_source"] == "teachers/a" and got["tokenizer_sha256"] == "1" * 64

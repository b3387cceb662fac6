"""No prompt, no unchecked code: `zg export` of a student whose modeling file was planted with a line of code is
refused in one line in both formats, with a terminal-like stdin that would answer "y" to transformers' "run the
custom code?", the planted line never runs, and nothing but the result would reach stdout. A teacher directory that
names its own code (auto_map) or holds only pickled weights is refused at prepare in zg's own line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.models import make_student
from tests.helpers.runners import zg_main


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A student with per-layer MLP widths (so it ships zg's modeling file), that file's first line planted to
    write MARKER; (student, marker)."""
    student = make_student(tmp_path / "student", "llama", [32, 16], keep=[0, 1])
    marker = tmp_path / "PLANTED_CODE_RAN"
    code = next(student.glob("modeling_zg_*.py"))
    code.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + code.read_text())
    return student, marker


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_export_of_a_planted_modeling_file_is_refused_and_the_code_never_runs(tmp_path, fmt):
    student, marker = _planted(tmp_path)
    out = tmp_path / "out"
    res = subprocess.run(
        [str(Path(sys.executable).parent / "zg"), "export", str(student), "--format", fmt, "--out", str(out)],
        cwd=tmp_path,
        input="y\ny\ny\n",  # what a user at a terminal might answer to a prompt
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert_user_error(res)
    assert not marker.exists(), "the planted line ran"
    assert res.stdout == "", res.stdout  # no prompt text, no partial result
    assert "custom code" not in res.stderr and not out.exists()


def _teacher_dir(tmp_path: Path) -> Path:
    from zgdata.teacher.prepare import tiny_teacher

    model, tok = tiny_teacher("llama")
    path = tmp_path / "teacher"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _prepare(tmp_path: Path, source: Path):
    root = tmp_path / "proj"
    zg_main("init", str(root), "--profile", "tiny", cwd=tmp_path)
    params = root / "params.yaml"
    text = params.read_text()
    assert "source: random:tiny\n" in text
    params.write_text(text.replace("source: random:tiny\n", f"source: {source}\n", 1))
    return root, zg_main("teacher", "prepare", cwd=root, check=False)


def test_a_teacher_that_names_its_own_code_is_refused_at_prepare(tmp_path):
    path = _teacher_dir(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "TEACHER_CODE_RAN"
    (path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    root, res = _prepare(tmp_path, path)
    assert_user_error(res, "config.json names custom code", "auto_map")
    assert not marker.exists() and not (root / "models" / "teacher").exists()


def test_a_pickle_only_teacher_gets_zgs_own_line(tmp_path):
    path = _teacher_dir(tmp_path)
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(path / "model.safetensors"), path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    root, res = _prepare(tmp_path, path)
    line = assert_user_error(res, "holds only pickled weights (pytorch_model.bin)", "safetensors")
    assert "weights_only" not in res.stderr and "weights_only" not in line
    assert not (root / "models" / "teacher").exists()

"""The teacher's identity is checked on every load: a swapped file in models/teacher/hf is refused.

Same-shape swaps are the dangerous case (nothing else fails): the replacement weights here come
from the same config with another seed, so the file has exactly the original's size.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.projects import read_json, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.core.hashing import tensors_sha256
from zgdata.layout import Layout
from zgdata.teacher.identity import cache_path, check_files
from zgdata.teacher.prepare import load_teacher, read_teacher_json

WEIGHTS = "models/teacher/hf/model.safetensors"
PUBLISHED = ("data/boundaries", "data/tokens.lance", "models/blocks", "models/student", "metrics")


def _published(root) -> dict:
    return {p: tree_sha256(root / p) if (root / p).exists() else None for p in PUBLISHED}


def _other_weights(root, tmp_path):
    """model.safetensors of another random teacher with the same config (another seed): same shape, same size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(root / "models" / "teacher" / "hf")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "other")
    path = tmp_path / "other" / "model.safetensors"
    assert path.stat().st_size == (root / WEIGHTS).stat().st_size  # a size check could not see this swap
    assert path.read_bytes() != (root / WEIGHTS).read_bytes()
    return path


def _swap_weights(root, tmp_path) -> None:
    shutil.copyfile(_other_weights(root, tmp_path), root / WEIGHTS)


def _build_student(root) -> None:
    """Train b00 and b01 and assemble, in one child process (one interpreter start instead of three)."""
    code = (
        "from zgtrain.project.config import ProjectConfig; from zgtrain.block.train import train_block; "
        "from zgtrain.student.assemble import assemble; p = ProjectConfig.load('params.yaml'); "
        "[train_block(p, k) for k in ('b00', 'b01')]; assemble(p)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, timeout=600)
    assert (root / "models" / "student" / "config.json").exists()


def _forge_cache(layout, teacher) -> None:
    """Make the digest cache claim the swapped weights are the recorded ones (their stat, the recorded digest)."""
    path = layout.root / WEIGHTS
    cache = json.loads(cache_path(layout).read_text())
    st = os.stat(path)
    cache["files"][str(path.resolve())] = {
        "stat": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino],
        "sha256": teacher["files"]["model.safetensors"],
    }
    cache_path(layout).write_text(json.dumps(cache))


@pytest.mark.long
def test_swapped_weights_are_refused_by_every_stage(tiny_project, tmp_path):
    layout, root = Layout(tiny_project), tiny_project
    _build_student(root)
    _swap_weights(root, tmp_path)
    before = _published(root)
    for cmd in (("train", "block", "b00", "--targets", "online"), ("train", "evaluate")):
        assert_user_error_alone(
            zg_main(*cmd, cwd=root, check=False),
            WEIGHTS,
            "does not match teacher.json",
            "dvc checkout --force teacher",
            "dvc repro -f teacher",
            alone=False,
        )
    assert not (root / "metrics" / "eval.json").exists()  # no gate verdict from the wrong teacher
    # materialize only loads the teacher when it must write: take the boundaries away
    shutil.move(root / "data" / "boundaries", tmp_path / "boundaries")
    assert_user_error_alone(zg_main("data", "materialize", cwd=root, check=False), WEIGHTS, "dvc repro -f teacher")
    assert not (root / "data" / "boundaries").exists()
    shutil.move(tmp_path / "boundaries", root / "data" / "boundaries")
    # verify hashes every byte: even a cache forged to vouch for the swapped file does not fool it
    teacher = read_teacher_json(layout)
    _forge_cache(layout, teacher)
    fooled = check_files(layout, teacher)  # an ordinary load trusts a matching stat: that is the cache's bargain
    assert (fooled.hashed, fooled.cached) == (0, len(teacher["files"]))
    assert_user_error_alone(zg_main("data", "verify", cwd=root, check=False), WEIGHTS, "does not match teacher.json")
    assert not (root / "reports" / "verify.json").exists()
    assert _published(root) == before


def _edit_tokenizer(root) -> None:
    path = root / "models" / "teacher" / "hf" / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["normalizer"] = {"type": "Lowercase"}  # still a valid tokenizer, just another one
    path.write_text(json.dumps(spec))


@pytest.mark.parametrize("case", ["tokenizer", "extra-file", "older-teacher-json"])
def test_other_changes_to_the_teacher_are_refused(tiny_project, case):
    root = tiny_project
    if case == "tokenizer":
        _edit_tokenizer(root)
        cmd, needles = ("data", "tokenize"), ("models/teacher/hf/tokenizer.json", "does not match teacher.json")
    elif case == "extra-file":  # e.g. custom model code dropped next to the weights
        (root / "models" / "teacher" / "hf" / "modeling_llama_custom.py").write_text("raise SystemExit\n")
        shutil.rmtree(root / "data" / "boundaries")  # so materialize must load the teacher
        cmd = ("data", "materialize")
        needles = ("models/teacher/hf/modeling_llama_custom.py", "teacher.json does not list it", "remove it")
    else:  # teacher.json from before per-file digests (and so before it recorded the digest of its content)
        meta = read_json(root / "models" / "teacher" / "teacher.json")
        del meta["files"], meta["content_sha256"]
        (root / "models" / "teacher" / "teacher.json").write_text(json.dumps(meta))
        cmd, needles = ("data", "tokenize"), ("teacher.json", "of an older zg", "dvc repro -f teacher")
    before = _published(root)
    assert_user_error_alone(zg_main(*cmd, cwd=root, check=False), *needles, alone=cmd[0] == "data")
    assert _published(root) == before


def test_touched_file_is_rehashed_and_accepted(tiny_project):
    layout, root = Layout(tiny_project), tiny_project
    teacher = read_teacher_json(layout)
    n = len(teacher["files"])
    cold = check_files(layout, teacher)  # a copied project: new inodes and ctimes, so the first check hashes all
    warm = check_files(layout, teacher)
    assert (cold.hashed, warm.hashed, warm.cached) == (n, 0, n)
    st = os.stat(root / WEIGHTS)
    os.utime(root / WEIGHTS, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, new mtime
    again = check_files(layout, teacher)
    assert (again.hashed, again.cached) == (1, n - 1)
    model, tok = load_teacher(layout)  # the real load accepts it (and its tokenizer hash check passes)
    assert tensors_sha256(model.state_dict()) == teacher["weights_sha256"]
    assert check_files(layout, teacher).cached == n  # the rehash was cached


def test_verify_rehashes_with_a_warm_cache(tiny_project):
    layout = Layout(tiny_project)
    teacher = read_teacher_json(layout)
    n = len(teacher["files"])
    check_files(layout, teacher)
    assert check_files(layout, teacher).cached == n  # warm
    report = json.loads(zg_main("data", "verify", "--json", cwd=tiny_project).stdout)
    assert report["status"] == "ok" and f"{n} teacher files rehashed" in report["summary"]
    assert report["teacher_files"] == {
        "files": n,
        "hashed": n,
        "cached": 0,
        "rehash": True,
        "weights_sha256_checked": True,
    }

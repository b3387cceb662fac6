"""Helpers shared by the zgtrain tests (a plain module: no fixtures, nothing mocked)."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml
from conftest import BIN, assert_user_error, read_json, tree_sha256  # noqa: F401 (re-exported)

__all__ = [
    "set_params",
    "read_json",
    "tree_sha256",
    "assert_user_error",
    "loss_curve",
    "copy_project",
    "load_params_of",
    "project_of",
    "kill_after_first_checkpoint",
    "import_llama_cpp",
    "llama_cpp_model",
    "llama_cpp_logits",
    "student_logits",
    "assert_close_to_f32",
]


def tiny_family_teacher(name: str):
    """Family ``name``'s tiny random teacher (zgdata/teacher/prepare.py), in eval mode."""
    from zgdata.teacher.prepare import _tiny_teacher

    model, _ = _tiny_teacher(name)
    return model.eval()


def teacher_layers(model, name: str, layers) -> dict:
    """What a conversion starts from: the teacher tensors of ``layers``, keyed ``layers.{i}.*`` as the slices are."""
    from zgdata.families.registry import family

    per_layer, _ = family(name).split_state(model.state_dict())
    return {f"layers.{i}.{k}": v for i in layers for k, v in per_layer[i].items()}


def b00_converted(tiny_built: Path, dst: Path, conversion: str, steps: int) -> Path:
    """A copy of the tiny project at ``dst`` whose block b00 says only ``conversion`` (its keys: defaults), trained
    ``steps`` steps, and whose b01 is the identity, untrained."""
    root = copy_project(tiny_built, dst)
    set_params(
        root,
        {
            "train.steps": steps,
            "blocks.b00.conversion": conversion,
            "blocks.b01.conversion": "identity",
            "blocks.b01.steps": 0,
        },
    )
    return root


def b00_weights(root: Path) -> dict:
    """Block b00's trainable tensors as its last checkpoint holds them."""
    from zgdata.layout import Layout
    from zgtrain.block.load import load_block

    block, _ = load_block(Layout(root), "b00")
    return block.weights()


def load_params_of(root: Path) -> dict:
    return yaml.safe_load((Path(root) / "params.yaml").read_text())


def project_of(root_or_params):
    """The typed ProjectConfig of a project root (its params.yaml) or of a params dict."""
    from zgtrain.project.config import ProjectConfig

    if isinstance(root_or_params, dict):
        return ProjectConfig.from_params(root_or_params)
    return ProjectConfig.from_params(load_params_of(root_or_params))


def set_params(root: Path, updates: dict) -> dict:
    """Set dotted keys (``{"train.steps": 30, "blocks.b01.lr": 1e-3}``) in ROOT/params.yaml; returns the params."""
    path = Path(root) / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for dotted, value in updates.items():
        *parents, leaf = dotted.split(".")
        node = params
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def loss_curve(root: Path, key: str = "b00") -> list[tuple[int, float]]:
    """Rows of plots/loss/KEY.csv as (step, loss); checks the header."""
    with open(Path(root) / "plots" / "loss" / f"{key}.csv", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["step", "loss"]
        return [(int(s), float(v)) for s, v in reader]


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def kill_after_first_checkpoint(args: list[str], cwd: Path, meta_path: Path, stderr_path: Path) -> None:
    """Run ``zg ARGS`` in CWD and `kill -9` it once META_PATH records a step > 0 (a checkpoint), before it ends.

    ZG_FAILPOINT_SLEEP_AFTER_STEP (the trainers' test hook) sleeps after each optimizer step, so the kill lands
    after a checkpoint and before the run can finish. meta.json is replaced atomically, so a read sees it whole."""
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "zg"), *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.5"},
        )
        try:
            deadline = time.monotonic() + 300  # a guard against hanging, not a timing assertion
            while proc.poll() is None and time.monotonic() < deadline:
                if meta_path.exists() and read_json(meta_path)["step"] > 0:
                    break
                time.sleep(0.01)
            assert proc.poll() is None, f"zg {' '.join(args)} exited before the kill (rc {proc.returncode})"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()  # when an assertion above failed; a second SIGKILL after ours is harmless
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


# --- GGUF exports run in llama.cpp (llama-cpp-python) -----------------------------------------------------------


def import_llama_cpp():
    """llama-cpp-python's module: `make setup` installs it, so in CI (env CI set) its absence fails the test;
    elsewhere the test is skipped."""
    import pytest

    try:
        import llama_cpp
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("llama_cpp (llama-cpp-python) is not importable in CI: run `make setup`")
        pytest.skip("llama-cpp-python is not installed (make setup installs it)")
    return llama_cpp


def llama_cpp_model(path: Path, n_ctx: int = 64):
    """The GGUF file in llama.cpp with an f32 KV cache (type 0 = GGML_TYPE_F32: the default f16 cache would round
    keys and values), every position's logits kept, one thread."""
    llama_cpp = import_llama_cpp()
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, type_k=0, type_v=0, n_threads=1
    )


def llama_cpp_logits(llm, ids: list[int]):
    """(len(ids), vocab) float64 logits of ``ids`` in a llama.cpp model, from an empty cache."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return np.asarray(llm.scores[: len(ids)], dtype=np.float64)


def student_logits(folder: Path, ids: list[int]):
    """(len(ids), vocab) float64 logits of a student folder in transformers at f32 (``load_student``)."""
    import torch

    from zgtrain.student.load import load_student

    with torch.no_grad():
        return load_student(folder)(torch.tensor([ids])).logits[0].double().numpy()


def assert_close_to_f32(got, want) -> None:
    """llama.cpp's f32 logits against transformers' f32: the same computation up to summation order (ggml's
    blocked dot products, its own softmax and RMSNorm), so they agree to float32 round-off amplified through the
    layers: max |diff| <= 1e-3 x (1 + max |logit|) (tests/zgtrain/export/test_gguf.py's docstring)."""
    import numpy as np

    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.abs(got - want).max()
    assert diff <= 1e-3 * (1 + np.abs(want).max()), diff

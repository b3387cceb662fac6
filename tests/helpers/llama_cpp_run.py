"""GGUF exports run in llama.cpp (llama-cpp-python), compared with the student in transformers."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["import_llama_cpp", "llama_cpp_model", "llama_cpp_logits", "assert_close_to_f32"]


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


# max |diff| / (1 + max |logit|) of llama.cpp's f32 logits against transformers' f32, 3-layer tiny students (AMD
# EPYC, 2026-12-06, every family and option of tests/zgtrain/export and the attention students): at most 8e-7 where
# the MLP's activation is SiLU, 1.2e-4 to 2.8e-4 where it is a GELU, which ggml computes from an f16 table. The bounds
# are about 25x and 4x those: an RMSNorm epsilon of 1e-5 written for 1e-6 moved Llama's by 5e-4.
F32_BOUND = 2e-5
F32_BOUND_GELU = 1e-3


def f32_bound(student) -> float:
    """The student folder's bound: F32_BOUND_GELU when its config names a GELU activation, else F32_BOUND."""
    import json

    cfg = json.loads((Path(student) / "config.json").read_text())
    acts = [cfg.get(k) for k in ("hidden_act", "hidden_activation", "activation_function")]
    return F32_BOUND_GELU if any(isinstance(a, str) and "gelu" in a for a in acts) else F32_BOUND


def assert_close_to_f32(got, want, student) -> None:
    """llama.cpp's f32 logits against transformers' f32 of the ``student`` folder: the same computation up to
    summation order (ggml's blocked dot products, its own softmax and RMSNorm) and, for GELU, ggml's table, so they
    agree to max |diff| <= f32_bound(student) x (1 + max |logit|) (tests/zgtrain/export/test_gguf.py's docstring)."""
    import numpy as np

    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.abs(got - want).max()
    assert diff <= f32_bound(student) * (1 + np.abs(want).max()), diff

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


def assert_close_to_f32(got, want) -> None:
    """llama.cpp's f32 logits against transformers' f32: the same computation up to summation order (ggml's
    blocked dot products, its own softmax and RMSNorm), so they agree to float32 round-off amplified through the
    layers: max |diff| <= 1e-3 x (1 + max |logit|) (tests/zgtrain/export/test_gguf.py's docstring)."""
    import numpy as np

    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.abs(got - want).max()
    assert diff <= 1e-3 * (1 + np.abs(want).max()), diff

"""`zg export --format hf`: a student as a stock transformers folder, per family (zgtrain/export/hf.py).

Each family's students are written here by the functions ``build_from_blocks`` and ``save_student`` use
(``student_model``, ``write_student_files``: zgtrain/student/assemble.py, via tests/helpers/models.py), from the
family's tiny random teacher (``teacher.source: random:tiny-<family>``) cut to some layers and pruned: the config
``student_config`` gives a uniform student, else zg's pinned template config and class with
``intermediate_sizes`` / ``layer_windows``; the shipped modeling file, the tokenizer, zerograph.json and
checksums.json. That skips the tokens and boundaries, which export never reads
(tests/zgtrain/export/test_export_cli.py exports a student the pipeline assembled). Every export is loaded with
``trust_remote_code=False`` and its logits ``torch.equal`` the student's (``load_student``, the same dtype), over
sequences longer than every window.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import models
from zgdata.errors import ZgError
from zgdata.families.registry import family, family_of
from zgdata.layout import Layout

FAMILIES = ("llama", "qwen2", "gpt2", "mistral", "granite", "olmo2", "phi3", "gemma2", "gemma3_text")
FAMILIES += ("qwen3", "glm", "exaone4")  # verified at prepare (no record): discovered width field, stock config
SEQ = 24  # longer than the tiny teachers' sliding_window (16) and every window below


def make_student(path, model_type: str, widths: list, windows: list | None = None, keep: list | None = None):
    """A student folder as save_student writes it: ``widths`` per layer, ``windows`` (zg's layer_windows),
    ``keep``: the teacher layers kept (their attention types, Gemma), default the first len(widths)."""
    return models.make_student(path, model_type, widths, windows, keep)


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))


def assert_stock_and_equal(student, out, model_type: str, dtype=torch.float32):
    """``out`` loads without remote code into the family's own class; its logits equal the student's."""
    from transformers import AutoModelForCausalLM

    from zgtrain.student.load import load_student

    fam = family(model_type)
    assert not list(out.glob("*.py")) and "auto_map" not in json.loads((out / "config.json").read_text())
    got = AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=False, dtype=dtype, attn_implementation=fam.attn_implementation
    ).eval()
    want = load_student(student, dtype=dtype)
    assert type(got) is fam.causal_lm() and got.dtype == dtype
    ids = _ids(got.config.vocab_size)
    with torch.no_grad():
        a, b = got(input_ids=ids).logits, want(input_ids=ids).logits
    assert a.dtype == dtype and torch.equal(a, b)
    return got


def _export(student, out, dtype="f32"):
    from zgtrain.export.run import export

    return export(student, "hf", out=out, dtype=dtype, layout=Layout(out.parent))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_family_exports_uniform_and_dropped_students_and_refuses_mixed_widths(model_type, tmp_path):
    config = family(model_type).tiny_config(_tok())
    width = family_of(config).width(config)
    # uniform: every layer pruned to half the width
    uniform = make_student(tmp_path / "uniform", model_type, [width // 2] * 4)
    r = _export(uniform, tmp_path / "u-out")
    got = assert_stock_and_equal(uniform, tmp_path / "u-out", model_type)
    assert got.config.num_hidden_layers == 4 and r.info["trust_remote_code"] is False
    # dropped layers only (teacher layer 1 dropped): a stock config of 3 layers, Gemma's types follow the kept ones
    dropped = make_student(tmp_path / "dropped", model_type, [width] * 3, keep=[0, 2, 3])
    _export(dropped, tmp_path / "d-out")
    got = assert_stock_and_equal(dropped, tmp_path / "d-out", model_type)
    assert got.config.num_hidden_layers == 3
    student_types = json.loads((dropped / "config.json").read_text()).get("layer_types")
    assert getattr(got.config, "layer_types", None) == student_types
    # mixed widths plus a dropped layer: ships zg's modeling code; refused with one line, nothing written
    mixed = make_student(tmp_path / "mixed", model_type, [width, width // 2, width], keep=[0, 2, 3])
    with pytest.raises(ZgError) as e:
        _export(mixed, tmp_path / "m-out")
    msg = str(e.value)
    assert "\n" not in msg and f"layer 1 has MLP width {width // 2} where layer 0 has {width}" in msg
    assert "student folder" in msg or "--format gguf" in msg
    assert not (tmp_path / "m-out").exists() and not list(tmp_path.glob(".m-out*"))


def _tok():
    from zgdata.teacher.tokenizer import byte_level_tokenizer

    return byte_level_tokenizer()


# (family, layer widths, zg windows, teacher layers kept) -> the stock config's window fields
WINDOWED_OK = {
    # Qwen2: per-layer types, one window for the sliding layers; max_window_layers at the first sliding one
    "qwen2": ([128] * 4, [None, None, 8, 8], None),
    # Mistral: every layer's window min(8, the config's 16) = 8: one global sliding_window
    "mistral": ([128] * 4, [8] * 4, None),
    # Phi-3 (no window in its config): the same window on every layer
    "phi3": ([128] * 4, [8] * 4, None),
    # Gemma 2: a full layer (1) with a window joins the sliding layers (0, 2), whose window min(8, 16) it shares
    "gemma2": ([128] * 4, [8, 8, 8, None], None),
    # Gemma 3: windows only on its sliding layers (0, 1, 3), all min(8, 16) = 8; layer 2 stays full
    "gemma3_text": ([128] * 4, [8, 8, None, 8], None),
}


@pytest.mark.parametrize("model_type", sorted(WINDOWED_OK))
def test_windows_the_stock_config_can_say_export_bit_identically(model_type, tmp_path):
    widths, windows, keep = WINDOWED_OK[model_type]
    student = make_student(tmp_path / "s", model_type, widths, windows, keep)
    assert json.loads((student / "zerograph.json").read_text())["remote_code"] is True
    _export(student, tmp_path / "out")
    got = assert_stock_and_equal(student, tmp_path / "out", model_type)
    assert got.config.sliding_window == 8
    if model_type == "qwen2":
        assert got.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
        assert got.config.use_sliding_window and got.config.max_window_layers == 2
    if model_type == "gemma2":
        assert got.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"]


WINDOWED_REFUSED = {
    "llama": ([128] * 4, [None, 8, None, None], "layer 1 attends within a window of 8 tokens"),
    "gpt2": ([256] * 4, [8] * 4, "has no sliding-window attention"),
    # Mistral's layer 2 keeps the config's window (16), the others min(8, 16): two windows
    "mistral": ([128] * 4, [8, 8, None, 8], "layer 0 attends within 8 tokens and layer 2 within 16"),
    "phi3": ([128] * 4, [8, 8, None, 8], "layer 2 attends fully while layer 0 has a window of 8"),
    "qwen2": ([128] * 4, [None, 4, 8, None], "layer 1 attends within 4 tokens and layer 2 within 8"),
    "gemma3_text": ([128] * 4, [None, None, 8, None], "layer 2 is a full-attention layer with a window of 8"),
}


@pytest.mark.parametrize("model_type", sorted(WINDOWED_REFUSED))
def test_windows_no_stock_config_can_say_are_refused(model_type, tmp_path):
    widths, windows, needle = WINDOWED_REFUSED[model_type]
    student = make_student(tmp_path / "s", model_type, widths, windows)
    with pytest.raises(ZgError) as e:
        _export(student, tmp_path / "out")
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("model_type", "dtype"), [("llama", "bf16"), ("gemma2", "f16"), ("qwen2", "bf16")])
def test_half_dtypes_equal_the_student_cast_to_them(model_type, dtype, tmp_path):
    config = family(model_type).tiny_config(_tok())
    width = family_of(config).width(config)
    windows = [None, None, 8, 8] if model_type == "qwen2" else None
    student = make_student(tmp_path / "s", model_type, [width // 2] * 4, windows)
    r = _export(student, tmp_path / "out", dtype=dtype)
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    assert_stock_and_equal(student, tmp_path / "out", model_type, dtype=torch_dtype)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == str(torch_dtype).split(".")[1]
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["dtype"] == dtype and record["files"] == r.files and "model.safetensors" in r.files

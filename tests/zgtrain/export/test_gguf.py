"""GGUF export (zgtrain/export/gguf.py) checked in llama.cpp itself (llama-cpp-python) and in transformers' GGUF loader.

Each family's tiny random teacher (``random:tiny-<family>``, the one tests/zgtrain/test_families.py runs through
the CLI) becomes a real student folder in-process, through the functions ``build_from_blocks`` + ``save_student``
use (``student_model``, ``write_student_files``: tests/helpers/models.py), so the same config, renumbered layers, zg's
pinned modeling file for per-layer widths, tokenizer, zerograph.json and checksums.json, minus the teacher lineage
and model card that need a project; the export reads it only through ``load_student``. Layer 2 of 4 is dropped
(fewer layers; Gemma's per-layer sliding pattern must follow the kept layers) and the MLPs pruned with
``Family.prune_mlp``: uniformly, or to mixed widths.

Tolerances. The student runs in transformers at f32; llama.cpp runs the f32 GGUF with an f32 KV cache. The
computations are the same up to summation order (ggml's blocked dot products, its own softmax and RMSNorm), so
the f32 logits agree to float32 round-off amplified through 3 layers: max |diff| <= 2e-5 x (1 + max |logit|) (measured
at most 8e-7), or 1e-3 x for a GELU family, whose GELU ggml computes from an f16 table (measured 1.2e-4 to 2.8e-4):
tests/helpers/llama_cpp_run.py ``f32_bound``. The uniform students carry a norm epsilon and a RoPE base off every
default, and the GGUF's values are read back too. f16 rounds every weight to 11 significant bits (relative
2^-12 ~ 2.4e-4 each) and q8_0 to 8-bit blocks of 32 (relative ~ 1/254 of the block's max): for random weights the logits then move by a small
fraction of their spread, bounded by max |diff| <= 0.05 (f16) / 0.25 (q8_0) x std(logits) with the same argmax
on >= 90% of positions.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import models
from tests.helpers.llama_cpp_run import assert_close_to_f32, import_llama_cpp, llama_cpp_logits, llama_cpp_model
from tests.helpers.models import student_logits
from zgdata.errors import ZgError
from zgdata.families.registry import family_of

# declared families, then decoders verified at prepare that llama.cpp has an architecture for
FAMILIES = ["gemma2", "gemma3_text", "gpt2", "granite", "llama", "mistral", "olmo2", "phi3", "qwen2"]
FAMILIES += ["qwen3", "starcoder2", "phi", "olmo"]
PER_LAYER = {"llama", "mistral", "qwen2"}  # mixed MLP widths export as llama.cpp's deci
# archs transformers' GGUF loader reads (uniform students); its gpt2 mapping turns feed_forward_length into an unused
# config field (transformers 5.24 integrations/ggml.py), so a GPT-2 student of pruned width does not load there
HF_GGUF = {"llama", "mistral", "qwen2", "phi3"}
KEEP = [0, 1, 3]  # teacher layer 2 dropped
TEXT = "Is this a dagger which I see before me, the handle toward my hand? Come, let me clutch thee."


@pytest.fixture(scope="module")
def llama_cpp():
    return import_llama_cpp()


def make_student(folder, name: str, *, widths=None, windows=None, keep=KEEP, tie=False, config=None):
    """A student folder of family ``name``: teacher layers ``keep`` with MLP widths ``widths`` (first channels,
    default half the teacher's); ``tie``: the LM head tied to the embeddings (as released Gemma 2 models are; the
    tiny teacher's is its own); ``config``: fields set on the teacher's config first. Written by the production
    code (tests/helpers/models.py)."""
    from zgdata.teacher.prepare import tiny_teacher

    teacher = tiny_teacher(name)[0].config
    widths = widths or [family_of(teacher).width(teacher) // 2] * len(keep)
    return models.make_student(folder, name, widths, windows, keep, tie=tie, config=config)


def _ids(folder, n: int) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).encode(TEXT)[:n]


def _off_default(name: str) -> dict:
    """The norm epsilon and the RoPE base set off every default (the tiny teachers use 10,000, the writer's
    fallback), so a value read from the wrong config key shows in the logits (f32_bound: an epsilon of 1e-5 written
    for 1e-6 moved Llama's by 25x the bound)."""
    from zgdata.teacher.prepare import tiny_teacher

    cfg = tiny_teacher(name)[0].config.to_dict()
    out = {k: 3e-6 for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon") if k in cfg}
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:  # gemma3_text's are per layer type: 10,000 and 1,000,000
        out["rope_parameters"] = {**rope, "rope_theta": 30000.0}
    return out


def _assert_written(path, arch: str, off: dict) -> None:
    """The GGUF's norm epsilon and RoPE base are the config's (read back with the gguf library): a GELU family's
    logits alone would not show a wrong epsilon under its bound."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields

    def value(key):
        f = fields[f"{arch}.{key}"]
        return float(f.parts[f.data[0]][0])

    eps = [v for k, v in off.items() if k != "rope_parameters"]
    if eps:
        key = next(k for k in ("layer_norm_rms_epsilon", "layer_norm_epsilon") if f"{arch}.attention.{k}" in fields)
        assert value(f"attention.{key}") == float(np.float32(eps[0])), (key, value(f"attention.{key}"))
    if "rope_parameters" in off:
        assert value("rope.freq_base") == off["rope_parameters"]["rope_theta"]


@pytest.mark.parametrize("name", FAMILIES)
def test_uniform_student_with_a_dropped_layer_runs_in_llama_cpp(name, tmp_path, llama_cpp):
    from zgtrain.export.gguf import export_gguf

    student = make_student(tmp_path / "student", name, tie=name == "gemma2", config=_off_default(name))
    cfg = json.loads((student / "config.json").read_text())
    assert all(cfg.get(k) == v for k, v in _off_default(name).items()), cfg  # the student carries them
    out = tmp_path / "student.gguf"
    info = export_gguf(student, out, dtype="f32")
    assert info["n_layers"] == 3 and len(set(info["n_ff"])) == 1 and info["arch"] != "deci"
    _assert_written(out, info["arch"], _off_default(name))
    n = info.get("context_length_capped_to_window", 32)  # Mistral: window 16 is the context; Gemma: 32 > window 16
    ids = _ids(student, n)
    want = student_logits(student, ids)
    assert_close_to_f32(llama_cpp_logits(llama_cpp_model(out), ids), want, student)
    if name in HF_GGUF:  # a second, independent reader of the same file
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32).eval()
        with torch.no_grad():
            again = hf(torch.tensor([ids])).logits[0].double().numpy()
        assert_close_to_f32(again, want, student)


@pytest.mark.parametrize("name", FAMILIES)
def test_mixed_widths_export_as_deci_or_are_refused(name, tmp_path, llama_cpp):
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.export.gguf import check_gguf, export_gguf

    config = tiny_teacher(name)[0].config
    width = family_of(config).width(config)
    widths = [width, width // 2, width // 4]
    student = make_student(tmp_path / "student", name, widths=widths)
    out = tmp_path / "student.gguf"
    if name not in PER_LAYER:
        with pytest.raises(ZgError) as e:
            export_gguf(student, out)
        msg = str(e.value)
        # the hf export refuses mixed widths too (a stock config has one): the folder itself is what runs it
        assert "layer 1 has MLP width" in msg and "keep the student folder" in msg and "--format hf" not in msg
        assert "\n" not in msg
        assert not out.exists()
        return
    check_gguf(student)
    info = export_gguf(student, out, dtype="f32")
    assert info["arch"] == "deci" and info["n_ff"] == widths
    n = info.get("context_length_capped_to_window", 32)
    ids = _ids(student, n)
    want = student_logits(student, ids)
    assert_close_to_f32(llama_cpp_logits(llama_cpp_model(out), ids), want, student)


def test_f16_and_q8_0_load_and_stay_close(tmp_path, llama_cpp):
    from zgtrain.export.gguf import export_gguf

    student = make_student(tmp_path / "student", "llama", widths=[128, 64, 96])
    ids = _ids(student, 32)
    want = student_logits(student, ids)
    for dtype, bound in (("f16", 0.05), ("q8_0", 0.25)):
        out = tmp_path / f"{dtype}.gguf"
        info = export_gguf(student, out, dtype=dtype)
        assert info["dtype"] == dtype and info["tensor_dtypes"].get(dtype, 0) > 0
        got = llama_cpp_logits(llama_cpp_model(out), ids)
        err = np.abs(got - want).max() / want.std()
        agree = (got.argmax(-1) == want.argmax(-1)).mean()
        assert err <= bound and agree >= 0.9, (dtype, err, agree)


def test_teacher_from_gguf_parses_once_and_reads_the_same_bits(tmp_path):
    """`zg teacher prepare` of a .gguf loads it through transformers inside ``_gguf_parsed_once``
    (zgdata/teacher/prepare.py): one parse of the file where transformers makes one for the config and one for the
    weights (and one for the tokenizer), and one tensor-name map instead of one per module. The model's tensors
    (q8_0, so dequantized) and config are the same as transformers' own parses give; gguf is left as it was. (The
    tiny byte-level tokenizer does not load from a GGUF; the tokenizer reads the same reader's fields.)"""
    from contextlib import nullcontext

    import gguf
    from transformers import AutoModelForCausalLM

    from zgdata.teacher.prepare import _gguf_parsed_once
    from zgtrain.export.gguf import export_gguf

    student = make_student(tmp_path / "student", "llama")
    out = tmp_path / "teacher.gguf"
    export_gguf(student, out, dtype="q8_0")
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    calls = {"parse": 0, "map": 0}

    def counted_reader(*args, **kwargs):
        calls["parse"] += 1
        return reader(*args, **kwargs)

    def counted_map(*args):
        calls["map"] += 1
        return name_map(*args)

    loaded = {}
    try:
        gguf.GGUFReader, gguf.get_tensor_name_map = counted_reader, counted_map
        for once in (False, True):
            calls.update(parse=0, map=0)
            with _gguf_parsed_once() if once else nullcontext():
                model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32)
            assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (counted_reader, counted_map)  # restored
            loaded[once] = (model.state_dict(), model.config.to_dict(), dict(calls))
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    (plain, cfg, plain_calls), (once, cfg_once, once_calls) = loaded[False], loaded[True]
    assert plain_calls["parse"] >= 2 and plain_calls["map"] > 1, plain_calls
    assert once_calls == {"parse": 1, "map": 1}, once_calls
    assert plain.keys() == once.keys() and all(torch.equal(plain[k], once[k]) for k in plain)
    assert cfg == cfg_once


def test_tokenization_matches_transformers(tmp_path, llama_cpp):
    from transformers import AutoTokenizer

    from zgtrain.export.gguf import export_gguf

    student = make_student(tmp_path / "student", "llama")
    out = tmp_path / "student.gguf"
    info = export_gguf(student, out, dtype="f16")
    assert info["tokenizer_pre"] == "default" and info["add_bos"] is False
    tok = AutoTokenizer.from_pretrained(student)
    llm = llama_cpp_model(out)
    for text in (
        TEXT,
        "  two  spaces\tand\ttabs\n\nnewlines",
        "naïve café — 東京 🦙",
        "a<|endoftext|>b",
        "<|endoftext|>",
    ):
        want = tok(text)["input_ids"]
        assert llm.tokenize(text.encode(), add_bos=True, special=True) == want, text
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text, add_special_tokens=False)
    assert llm.token_eos() == tok.eos_token_id and llm.token_bos() == tok.bos_token_id


def test_zg_windows_untied_gemma2_and_unknown_dtypes_are_refused_before_writing(tmp_path):
    from zgtrain.export.gguf import export_gguf

    student = make_student(tmp_path / "student", "llama", windows=[None, 8, None])
    out = tmp_path / "student.gguf"
    with pytest.raises(ZgError) as e:
        export_gguf(student, out)
    assert "layer 1 has a zg sliding window of 8 tokens" in str(e.value) and "--format hf" in str(e.value)
    assert not out.exists()
    with pytest.raises(ZgError, match="q4_k"):
        export_gguf(make_student(tmp_path / "uniform", "llama"), out, dtype="q4_k")
    assert not out.exists()
    with pytest.raises(ZgError, match="always uses the token embeddings as its head"):
        export_gguf(make_student(tmp_path / "gemma2", "gemma2"), out)  # the tiny Gemma 2 has its own LM head
    assert not out.exists()
    # a decoder verified at prepare whose architecture zg has not checked in llama.cpp: one line, nothing written
    with pytest.raises(ZgError, match="no llama.cpp architecture mapping for family 'glm'.*--format hf") as e:
        export_gguf(make_student(tmp_path / "glm", "glm"), out)
    assert "\n" not in str(e.value) and not out.exists()


def test_zg_export_of_a_named_student_advises_the_hf_export_of_that_student(tmp_path):
    """A GGUF refusal through `zg export STUDENT` advises `zg export STUDENT --format hf`: without STUDENT it would
    export models/student, not the folder that was refused. The default student's advice needs no argument."""
    from zgdata.layout import Layout
    from zgtrain.export.run import export

    layout = Layout(tmp_path / "proj")
    named = make_student(tmp_path / "glm", "glm")
    with pytest.raises(ZgError, match="no llama.cpp architecture mapping for family 'glm'") as e:
        export(named, "gguf", layout=layout)
    assert f"use `zg export {named} --format hf`" in e.value.fix, e.value.fix
    make_student(layout.root / "models" / "student", "glm")
    with pytest.raises(ZgError) as e:
        export("student", "gguf", layout=layout)
    assert "use `zg export --format hf`" in e.value.fix, e.value.fix
    assert not (layout.root / "models" / "export").exists()


def test_an_unknown_pre_tokenizer_is_refused(tmp_path):
    """A byte-level BPE whose check-text hash is not known (here: lower-casing first) is refused, not guessed."""
    from zgtrain.export.gguf import check_gguf

    student = make_student(tmp_path / "student", "llama")
    spec = json.loads((student / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (student / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ZgError, match="pre-tokenizer is not one zg knows"):
        check_gguf(student)


@pytest.mark.parametrize("family", ["mistral", "phi3", "starcoder2"])
def test_a_window_llama_cpp_does_not_read_is_written_as_the_context_length(family, tmp_path):
    """StarCoder2's `sliding_window` (4,096 in its releases, against 16,384 positions) is one llama.cpp's
    starcoder2 arch does not read: like Mistral's and Phi-3's, it becomes the GGUF's context_length, so llama.cpp
    never attends past it (it wrote 16,384). Written and read back with the gguf library."""
    import gguf

    from zgtrain.export.gguf_arch import ARCHS, write_hparams

    spec = ARCHS[family]
    arch = "llama" if family == "mistral" else spec.arch
    cfg = {
        "max_position_embeddings": 16384,
        "sliding_window": 4096,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "norm_epsilon": 1e-5,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
    }
    path = tmp_path / "hparams.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    notes = write_hparams(w, cfg, spec, arch, [128, 128], None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    field = gguf.GGUFReader(str(path)).fields[f"{arch}.context_length"]
    assert int(field.parts[field.data[0]][0]) == 4096 and notes["context_length_capped_to_window"] == 4096


# config options that change what llama.cpp must compute or load (each found by review: the file was written, then
# computed other logits or did not load)
OPTIONS = {
    # OLMo's q, k and v clamped to +-clip_qkv (attention.clamp_kqv); 0.05 clamps most of the tiny model's values
    "olmo-clip_qkv": ("olmo", {"clip_qkv": 0.05}),
    # Qwen3's own sliding layers: the qwen3 arch has no window, so the window (8) becomes the context
    "qwen3-sliding": (
        "qwen3",
        {
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * 4,
        },
    ),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),  # llama's loader takes optional biases
}


@pytest.mark.parametrize("case", OPTIONS)
def test_config_options_llama_cpp_computes_the_same(case, tmp_path, llama_cpp):
    from zgtrain.export.gguf import export_gguf

    name, config = OPTIONS[case]
    student = make_student(tmp_path / "student", name, config=config)
    out = tmp_path / "student.gguf"
    info = export_gguf(student, out, dtype="f32")
    assert info.get("context_length_capped_to_window") == (8 if case == "qwen3-sliding" else None)
    assert info.get("clamp_kqv") == config.get("clip_qkv")
    ids = _ids(student, info.get("context_length_capped_to_window", 32))
    assert_close_to_f32(llama_cpp_logits(llama_cpp_model(out), ids), student_logits(student, ids), student)


@pytest.mark.parametrize(
    ("name", "config", "says"),
    [
        ("qwen3", {"attention_bias": True}, "attention_bias: true, and llama.cpp's 'qwen3' architecture loads no bias"),
        ("olmo", {"attention_bias": True}, "llama.cpp's 'olmo' architecture loads no bias"),
        ("olmo2", {"attention_bias": True}, "llama.cpp's 'olmo2' architecture loads no bias"),
        ("starcoder2", {"use_bias": False}, "use_bias: false, and llama.cpp's 'starcoder2' architecture needs"),
        ("phi", {"qk_layernorm": True}, "qk_layernorm: true), which llama.cpp's 'phi2' architecture has no"),
    ],
)
def test_options_the_arch_cannot_carry_are_refused_before_writing(name, config, says, tmp_path):
    from zgtrain.export.gguf import check_gguf, export_gguf

    student = make_student(tmp_path / "student", name, config=config)
    out = tmp_path / "student.gguf"
    for call in (lambda: check_gguf(student), lambda: export_gguf(student, out)):
        with pytest.raises(ZgError) as e:
            call()
        assert says in str(e.value) and "--format hf" in e.value.fix and "\n" not in str(e.value)
    assert not out.exists()

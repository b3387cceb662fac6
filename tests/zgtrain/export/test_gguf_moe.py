"""GGUF export of mixture-of-experts students (zgtrain/export/gguf_moe.py), run in llama.cpp (llama-cpp-python).

Each family's tiny random teacher becomes a student folder in-process (``make_moe_student``, tests/helpers/models.py:
the production ``student_model`` + ``write_student_files``), teacher layer 2 of 4 dropped, as test_gguf.py's
students are; each layer keeps all 4 experts (top-2: identity), its first 3 (top-2 of 3: prune_experts with fewer
experts), or one expert made of two experts' channels (top-1: moe_to_dense). Two teachers get a config field of
their released models, so that llama.cpp's arch runs them as transformers does: Qwen3-MoE renormalizes its top-k
routing weights (``norm_topk_prob``; llama.cpp's qwen3moe always does, the tiny config does not) and OLMoE has as
many KV heads as query heads (llama.cpp's olmoe norms keys over the model's width). The refusals are checked on the
tiny configs as they are.

Tolerances: test_gguf.py's. f32 against f32 is the same computation up to summation order: max |diff| <= 1e-3 x
(1 + max |logit|) (``assert_close_to_f32``; measured 1.2e-6 to 3.0e-6, under 1e-3 of the bound). f16 within
0.05 x std(logits) at every position. q8_0 moves the router's input a little, and where a token's two best experts
are nearly tied it may pick the other: that position's logits then differ by more than quantization (measured: one
position of 32 at 0.4 x std, the others <= 0.2), so q8_0 is held to test_gguf.py's 0.25 x std on >= 90% of
positions and the same argmax on >= 90% (the routers themselves stay f32, as convert_hf_to_gguf keeps them).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.llama_cpp_run import assert_close_to_f32, import_llama_cpp, llama_cpp_logits, llama_cpp_model
from tests.helpers.models import make_moe_student, student_logits
from zgdata.errors import ZgError

ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}
RUNNABLE = {"qwen3_moe": {"norm_topk_prob": True}, "olmoe": {"num_key_value_heads": 4}}
KEEP = [0, 1, 3]  # teacher layer 2 dropped
# conversion -> (experts per layer, 0: one merged expert; top-k per layer)
CASES = {"identity": ([4] * 3, [2] * 3), "prune_experts": ([3] * 3, [2] * 3), "moe_to_dense": ([0] * 3, [2] * 3)}
TEXT = "Is this a dagger which I see before me, the handle toward my hand? Come, let me clutch thee."


@pytest.fixture(scope="module")
def llama_cpp():
    return import_llama_cpp()


def _ids(folder, n: int = 32) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).encode(TEXT)[:n]


def _refused(student, out, *needles):
    from zgtrain.export.gguf import check_gguf, export_gguf

    with pytest.raises(ZgError) as e:
        check_gguf(student)
    with pytest.raises(ZgError):
        export_gguf(student, out)
    msg = f"{e.value} {e.value.fix}"
    assert "\n" not in msg and all(n in msg for n in needles), msg
    assert not out.exists()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ARCH)
def test_uniform_moe_student_runs_in_llama_cpp(name, case, tmp_path, llama_cpp):
    from zgtrain.export.gguf import export_gguf

    experts, top_k = CASES[case]
    student = make_moe_student(tmp_path / "student", name, experts, top_k, KEEP, config=RUNNABLE.get(name))
    out = tmp_path / "student.gguf"
    info = export_gguf(student, out, dtype="f32")
    n = experts[0] or 1
    assert (info["arch"], info["experts"], info["experts_used"]) == (ARCH[name], n, top_k[0] if n > 1 else 1)
    assert (
        info["n_layers"] == 3 and len(set(info["n_ff"])) == 1 and ("shared_expert_ff" in info) == (name == "qwen2_moe")
    )
    ids = _ids(student)
    assert_close_to_f32(llama_cpp_logits(llama_cpp_model(out), ids), student_logits(student, ids), student)


def test_moe_f16_and_q8_0_stay_close_with_f32_routers(tmp_path, llama_cpp):
    import gguf

    from zgtrain.export.gguf import export_gguf

    student = make_moe_student(tmp_path / "student", "qwen2_moe", *CASES["identity"], KEEP)  # with a shared expert
    ids = _ids(student)
    want = student_logits(student, ids)
    for dtype in ("f16", "q8_0"):
        out = tmp_path / f"{dtype}.gguf"
        info = export_gguf(student, out, dtype=dtype)
        kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
        assert kinds["blk.0.ffn_gate_exps.weight"] == dtype.upper()
        assert kinds["blk.0.ffn_gate_inp.weight"] == kinds["blk.0.ffn_gate_inp_shexp.weight"] == "F32"
        assert info["tensor_dtypes"][dtype] > 0
        got = llama_cpp_logits(llama_cpp_model(out), ids)
        err = np.abs(got - want).max(-1) / want.std()
        agree = (got.argmax(-1) == want.argmax(-1)).mean()
        if dtype == "f16":
            assert err.max() <= 0.05, err
        else:
            assert (err <= 0.25).mean() >= 0.9 and agree >= 0.9, (err, agree)


def test_per_layer_expert_counts_or_top_k_are_refused(tmp_path):
    out = tmp_path / "student.gguf"
    student = make_moe_student(tmp_path / "experts", "mixtral", [4, 2, 4], [2, 2, 2], KEEP)
    _refused(student, out, "layer 1 has 2 experts where layer 0 has 4", "'llama'", "train.keep_experts")
    student = make_moe_student(tmp_path / "top_k", "qwen2_moe", [4, 4, 4], [2, 1, 2], KEEP)
    _refused(student, out, "layer 1 runs the top 1 per token where layer 0 runs the top 2", "train.active_experts")
    # prune_experts in two blocks, moe_to_dense in one: the counts are named before the widths
    student = make_moe_student(tmp_path / "mixed", "olmoe", [2, 2, 0], [2, 2, 2], KEEP, config=RUNNABLE["olmoe"])
    _refused(student, out, "layer 2 has 1 expert where layer 0 has 2", "'olmoe'")


def test_routing_llama_cpp_weighs_otherwise_is_refused_unless_every_expert_runs(tmp_path, llama_cpp):
    from zgtrain.export.gguf import export_gguf

    out = tmp_path / "student.gguf"
    # the tiny Qwen3-MoE does not renormalize (norm_topk_prob false); llama.cpp's qwen3moe always does
    student = make_moe_student(tmp_path / "qwen3", "qwen3_moe", *CASES["identity"], KEEP)
    _refused(student, out, "does not renormalize each token's top-2", "'qwen3moe' graph always does", "--format hf")
    student = make_moe_student(
        tmp_path / "qwen2", "qwen2_moe", *CASES["identity"], KEEP, config={"norm_topk_prob": True}
    )
    _refused(student, out, "student renormalizes", "'qwen2moe' graph never does")
    # top-2 of 2: the two probabilities already sum to 1, renormalized or not
    student = make_moe_student(tmp_path / "all", "qwen3_moe", [2] * 3, [2] * 3, KEEP)
    export_gguf(student, out, dtype="f32")
    ids = _ids(student)
    assert_close_to_f32(llama_cpp_logits(llama_cpp_model(out), ids), student_logits(student, ids), student)


def test_olmoe_with_grouped_query_attention_is_refused(tmp_path):
    student = make_moe_student(tmp_path / "student", "olmoe", *CASES["identity"], KEEP)  # 2 KV heads for 4
    _refused(student, tmp_path / "student.gguf", "2 KV heads for 4 query heads", "'olmoe'", "--format hf")


def test_olmoe_clip_qkv_is_refused_before_writing(tmp_path):
    """OLMoE's clip_qkv (q, k, v clamped): llama.cpp's olmoe does not apply attention.clamp_kqv (written, its
    logits were 4.4 away from the student's, against 3e-3 allowed), so the export is refused."""
    config = {**RUNNABLE["olmoe"], "clip_qkv": 0.05}
    student = make_moe_student(tmp_path / "student", "olmoe", [4] * 3, [2] * 3, KEEP, config=config)
    _refused(student, tmp_path / "student.gguf", "clamps q, k and v (clip_qkv: 0.05)", "'olmoe'", "--format hf")


@pytest.mark.parametrize("name", ["qwen3_moe", "olmoe"])
def test_attention_biases_the_arch_does_not_load_are_refused_before_writing(name, tmp_path):
    config = {**RUNNABLE[name], "attention_bias": True}
    student = make_moe_student(tmp_path / "student", name, [4] * 3, [2] * 3, KEEP, config=config)
    _refused(
        student, tmp_path / "student.gguf", f"llama.cpp's '{ARCH[name]}' architecture loads no bias", "--format hf"
    )

"""Decoders without a record, trusted because the identity round trip holds (zgdata/families/verified.py,
selfcheck.py), or refused in one line naming the part that differed. The whole conversion of six verified
families runs in tests/zgtrain/test_families.py (``VERIFIED``); here: the self-check's verdicts and refusals,
discovery, and the conversions a discovered layout cannot run."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.families.discover import PartError
from zgdata.families.registry import FAMILIES, family, family_of, known
from zgdata.families.selfcheck import probe_ids, self_check
from zgdata.teacher.prepare import tiny_teacher

# Doge's layers take inputs the generic call does not give in the transformers CI runs (5.25); in 5.17's they take only
# what it gives, so the self-check passes there.
DOGE_REFUSED = tuple(int(x) for x in version("transformers").split(".")[:2]) >= (5, 25)


def _checked(model_type: str):
    model, tok = tiny_teacher(model_type)
    fam = family_of(model.config)
    fam.check(model.config)
    fam.check_model(model)
    return model.eval(), tok, fam


def test_a_verified_decoder_records_its_verdict_probe_and_parts():
    import transformers

    model, tok, fam = _checked("qwen3")
    assert "qwen3" not in FAMILIES and known("qwen3") and fam.verified
    verdict = self_check(model, fam, tok)
    ids = probe_ids(model.config.vocab_size, tok.pad_token_id)
    assert ids.shape[0] >= 3 and (ids[-1, -4:] == tok.pad_token_id).all()  # one row ends in padding
    import hashlib

    assert verdict["verdict"] == "pass" and verdict["transformers"] == transformers.__version__
    assert verdict["probe"]["sha256"] == hashlib.sha256(ids.numpy().tobytes()).hexdigest()
    parts = verdict["parts"]
    assert (parts["base"], parts["layers"], parts["norm"], parts["embed"], parts["head"]) == (
        "model",
        "layers",
        "norm",
        "embed_tokens",
        "lm_head",
    )
    assert parts["width_attr"] == "intermediate_size" and parts["mlp_out"] == "mlp.down_proj"
    assert {"self_attn.q_norm", "self_attn.k_norm"} <= set(parts["norms"])


@pytest.mark.parametrize(
    ("model_type", "part"),
    [
        ("cohere", "head:"),  # logits scaled by logit_scale outside the head module
        ("gemma", "embedding:"),  # the embedding scales by sqrt(hidden) inside the model's forward path
        pytest.param(  # its layers take inputs the generic call does not give
            "doge", "layer 0:", marks=pytest.mark.skipif(not DOGE_REFUSED, reason="5.17's Doge passes the check")
        ),
        ("smollm3", "layers:"),  # no_rope_layers: a per-layer config list that renumbered blocks would misread
        ("afmoe", "layer 1:"),  # dense layer 0, experts from layer 1 on: discovery reads layer 0 only
        # lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx) inside the attention: a block's layers are numbered from 0
        ("diffllama", "layer 1: its result depends on its index"),
    ],
)
def test_a_decoder_that_fails_the_check_is_refused_naming_the_part(model_type, part):
    with pytest.raises(PartError) as e:
        model, tok, fam = _checked(model_type)
        self_check(model, fam, tok)
    assert str(e.value).startswith(f"[teacher.source] {part}") and "\n" not in str(e.value)
    assert "record of its own" in str(e.value)


def test_a_layer_that_reads_outside_its_inputs_is_refused_by_its_index():
    """Layer 2 adds how often it ran before: the model's own forward and the adapter's call see different
    states, so boundary 3 differs and the refusal names layer 2; layers 0 and 1 matched."""
    model, tok, fam = _checked("qwen3")
    layer = fam.layers(model)[2]
    calls = []
    forward = layer.forward

    def stateful(hidden_states, *args, **kwargs):
        calls.append(1)
        return forward(hidden_states + float(len(calls) - 1), *args, **kwargs)

    layer.forward = stateful
    with pytest.raises(PartError, match=r"^\[teacher.source\] layer 2: .*\(boundary 3\)") as e:
        self_check(model, fam, tok)
    assert e.value.part == "layer 2" and len(calls) == 2


def test_a_student_config_that_is_not_the_teachers_is_refused_as_the_student_part(monkeypatch):
    """The ``student`` part builds the identity student from ``student_config`` and compares its logits with the
    teacher's: a config that changes the forward (here an rms_norm_eps of 0.5), though every boundary, the norm and
    the head round-trip, is refused naming the student."""
    model, tok, fam = _checked("qwen3")
    student_config = fam.student_config

    def wrong_eps(*args, **kwargs):
        config = student_config(*args, **kwargs)
        config.rms_norm_eps = 0.5
        return config

    monkeypatch.setattr(fam, "student_config", wrong_eps)
    with pytest.raises(PartError) as e:
        self_check(model, fam, tok)
    assert e.value.part == "student" and "\n" not in str(e.value)
    assert str(e.value).startswith(
        "[teacher.source] student: the adapter's result differs from the teacher's own forward "
        "(the identity student's logits)"
    )


def test_a_prune_that_mismatches_the_mlp_channels_is_refused_as_the_mlp_part(monkeypatch):
    """The ``mlp`` part prunes layer 0's MLP: every channel must give the same tensors, and half of them (a layer
    built at half width) the layer's output with the other channels silenced. A half-width prune whose down
    projection keeps the right channels in reversed order (its full-width prune is left right, so the first check
    passes) is refused naming the mlp; the same prune without the reversal passes."""
    model, tok, fam = _checked("qwen3")
    prune_mlp = fam.prune_mlp
    width = fam.width(model.config)

    def reversed_down(layer, keep):
        out = prune_mlp(layer, keep)
        if len(keep) < width:
            out["mlp.down_proj.weight"] = out["mlp.down_proj.weight"].flip(1)
        return out

    monkeypatch.setattr(fam, "prune_mlp", reversed_down)
    with pytest.raises(PartError) as e:
        self_check(model, fam, tok)
    assert e.value.part == "mlp" and str(e.value).startswith(
        "[teacher.source] mlp: the adapter's result differs from the teacher's own forward "
        "(a half-width prune does not equal the layer with those channels silenced)"
    )
    monkeypatch.setattr(fam, "prune_mlp", lambda layer, keep: {k: v.clone() for k, v in prune_mlp(layer, keep).items()})
    assert self_check(model, fam, tok)["verdict"] == "pass"  # the same tensors, copied: passes


def test_refusals_at_prepare_are_one_line_and_write_nothing(tmp_path):
    """Through `zg teacher prepare`: a Cohere checkpoint (its logit_scale is outside the head) and a model type
    transformers does not know stop with one line, the project untouched."""
    import json

    from transformers import CohereConfig

    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dump_params

    cohere = tmp_path / "cohere"
    torch.manual_seed(0)
    cfg = CohereConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    from transformers import AutoModelForCausalLM

    from zgdata.teacher.tokenizer import byte_level_tokenizer

    AutoModelForCausalLM.from_config(cfg).save_pretrained(cohere)
    byte_level_tokenizer().save_pretrained(cohere)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_decoder"}))
    for teacher, needles in (
        (cohere, ("head: the adapter's result differs", "record of its own")),
        (unknown, ("'no_such_decoder' is not supported", "transformers builds no causal LM")),
    ):
        root = tmp_path / f"proj-{teacher.name}"
        root.mkdir()
        (root / "params.yaml").write_text(dump_params(profile_params("tiny")))
        set_params(root, {"teacher.source": str(teacher), "partition.boundaries": [0, 1, 2]})
        before = tree_sha256(root)
        res = zg_main("teacher", "prepare", cwd=root, check=False)
        assert_user_error(res, "teacher.source", *needles)
        assert tree_sha256(root) == before and not (root / "models").exists()


def test_discovery_finds_other_layouts_and_the_conversions_they_cannot_run():
    """GPT-NeoX passes the round trip with its own names (embed_in, final_layer_norm, attention, dense_4h_to_h),
    but its attention is not `self_attn` and its layout is not the template's: kv_heads and the attention
    conversions, and a student with per-layer widths, are refused in one line each; prune_mlp runs."""
    from zgdata.errors import ZgError
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import TrainConfig
    from zgtrain.student.assemble import student_model

    model, tok, fam = _checked("gpt_neox")
    assert self_check(model, fam, tok)["verdict"] == "pass"
    p = fam.parts
    assert (p.embed, p.norm, p.attn, p.mlp_out) == ("embed_in", "final_layer_norm", "attention", "mlp.dense_4h_to_h")
    layers, _ = fam.split_state(model.state_dict())
    tensors = {f"layers.{i}.{k}": v for i in (0, 1) for k, v in layers[i].items()}
    x = torch.randn(2, 12, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    pruned = convert("prune_mlp", tensors, model.config, TrainConfig(prune_ratio=0.5), x, torch.Generator())
    assert pruned.intermediate_sizes == [fam.width(model.config) // 2] * 2
    for name in ("kv_heads", "window_attention", "attn_linear", "linear_attention"):
        with pytest.raises(ZgError, match=f"the {name} conversion needs an attention module `self_attn`") as e:
            convert(name, tensors, model.config, TrainConfig(window=4), x, torch.Generator())
        assert e.value.key == "train.conversion" and "\n" not in str(e.value)
    width = fam.width(model.config)
    with pytest.raises(ZgError, match="per-layer shapes .* not model.layers") as e:
        student_model(model.config.to_dict(), {}, [width, width // 2], [None, None], None, dtype=torch.float32)
    assert e.value.key == "train.conversion"


def test_kv_heads_runs_where_the_projections_are_found():
    """Qwen3's k_proj/v_proj are sized by num_key_value_heads: kv_heads builds a layer of one KV head, and at the
    teacher's own count the block is the teacher's, bit for bit."""
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import TrainConfig

    model, _, fam = _checked("qwen3")
    layers, _ = fam.split_state(model.state_dict())
    tensors = {f"layers.{i}.{k}": v for i in (0, 1) for k, v in layers[i].items()}
    x = torch.randn(2, 12, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    one = convert("kv_heads", tensors, model.config, TrainConfig(kv_heads=1), x, torch.Generator())
    assert one.kv_heads == [1, 1] and one.layers[0].self_attn.k_proj.out_features == model.config.head_dim
    same = convert("kv_heads", tensors, model.config, TrainConfig(kv_heads=2), x, torch.Generator()).eval()
    ident = convert("identity", tensors, model.config, TrainConfig(), x, torch.Generator()).eval()
    with torch.no_grad():
        assert torch.equal(same(x), ident(x))


def test_refused_kinds_stay_refused_and_records_stay_records():
    """Mixture-of-experts models without a record and hybrid models keep their one-line refusal (a self-check would
    not make an unknown router or a recurrent state a boundary); a declared family keeps its record, not a
    discovered adapter, and so do the MoE families with one."""
    for model_type in ("phimoe", "jamba"):
        assert not known(model_type)
        with pytest.raises(ZgError, match="zg does not support it"):
            family(model_type)
    assert not family("llama").verified and family("qwen3").verified
    assert known("mixtral") and not family("mixtral").verified and family("mixtral").moe is not None

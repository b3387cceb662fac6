"""Assemble the trained blocks into a standard transformers model (``models/student/``).

Teacher embeddings + block layers renumbered in order + final norm + LM head. Uniform
MLP widths give a plain Llama config that ``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from zgdata.boundary import boundary_fingerprint, boundary_lineage
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.teacher import load_slice, load_tokenizer, read_teacher_json
from zgtrain.trainer import load_block

__all__ = ["assemble", "build_student", "expected_fingerprints"]


def expected_fingerprints(params: dict, layout: Layout) -> dict[str, str]:
    """Fingerprints the current teacher, token set and params give each boundary (no datasets needed)."""
    part = section(params, PartitionConfig, "partition")
    mcfg = section(params, MaterializeConfig, "materialize")
    teacher = read_teacher_json(layout)
    if not layout.tokens_json.exists():
        raise ZgError(f"{layout.tokens_json} not found", fix="run `dvc repro tokens` (or `dvc pull data/tokens.json`)")
    tokens = json.loads(layout.tokens_json.read_text())
    return {n: boundary_fingerprint(boundary_lineage(teacher, tokens, layer, mcfg))
            for n, layer in zip(part.names, part.boundaries)}


def _blocks(params: dict, layout: Layout, which: str):
    part = section(params, PartitionConfig, "partition")
    want = expected_fingerprints(params, layout)
    out = []
    for spec in part.blocks():
        if not (layout.block_dir(spec.key) / "meta.json").exists():
            raise ZgError(f"block {spec.key} is missing ({layout.block_dir(spec.key)})",
                          fix=f"run `dvc repro train@{spec.key}`")
        block, meta = load_block(layout, spec.key, which=which)
        for name in (spec.input, spec.output):
            got = meta["fingerprints"].get(name)
            if got != want[name]:
                raise ZgError(f"block {spec.key} is stale: trained on {name} {str(got)[:12]} but the current "
                              f"boundary is {want[name][:12]}", fix=f"run `dvc repro train@{spec.key}`")
        out.append((spec, block, meta))
    return out


def build_student(params: dict, *, layout: Layout = Layout(), which: str = "final"):
    """The assembled LlamaForCausalLM in memory (``which``: final or init weights) and a summary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    blocks = _blocks(params, layout, which)
    head, hmeta = load_slice(layout.teacher_head)
    sizes = [m for _, b, _ in blocks for m in b.intermediate_sizes]
    config = LlamaConfig.from_dict(hmeta["config"])
    config.num_hidden_layers = len(sizes)
    config.intermediate_size = max(sizes)
    uniform = len(set(sizes)) == 1
    model_cls = LlamaForCausalLM
    if not uniform:  # per-layer widths: a config subclass plus modeling code shipped with the model
        from zgtrain.templates.modeling_zg_llama import ZgLlamaConfig, ZgLlamaForCausalLM
        config = ZgLlamaConfig(intermediate_sizes=sizes, **{k: v for k, v in config.to_dict().items()
                                                            if k not in ("model_type", "architectures")})
        model_cls = ZgLlamaForCausalLM
    config._attn_implementation = "sdpa"
    state = {"model.embed_tokens.weight": head["embed_tokens.weight"], "model.norm.weight": head["norm.weight"],
             "lm_head.weight": head["lm_head.weight"]}
    i = 0
    for _, block, _ in blocks:
        for j in range(len(block.layers)):
            for k, v in block.weights().items():
                if k.startswith(f"layers.{j}."):
                    state[f"model.layers.{i}.{k.split('.', 2)[2]}"] = v
            i += 1
    with torch.device("meta"):
        model = model_cls(config)
    model.load_state_dict({k: v.to(getattr(torch, hmeta["config"].get("dtype") or "float32")).clone()
                           for k, v in state.items()}, assign=True, strict=False)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ZgError(f"assembled model lacks {missing[:3]}", fix="re-run `dvc repro teacher` and the train stages")
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # rebuild buffers off the meta device
    teacher_params = read_teacher_json(layout)["params"]
    n = sum(p.numel() for p in model.parameters())
    summary = {"params": n, "teacher_params": teacher_params, "param_ratio": n / teacher_params, "layers": len(sizes),
               "intermediate_sizes": sizes, "remote_code": not uniform,
               "blocks": {spec.key: {"state_sha256": meta.get("state_sha256"), "fingerprints": meta["fingerprints"],
                                     "teacher_layers": meta["teacher_layers"]} for spec, _, meta in blocks}}
    return model.eval(), summary


def assemble(params: dict, *, layout: Layout = Layout()) -> dict:
    model, summary = build_student(params, layout=layout)
    out = layout.student
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if summary["remote_code"]:
        src = Path(__file__).parent / "templates" / "modeling_zg_llama.py"
        shutil.copy(src, tmp / "modeling_zg_llama.py")
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["auto_map"] = {"AutoConfig": "modeling_zg_llama.ZgLlamaConfig",
                           "AutoModelForCausalLM": "modeling_zg_llama.ZgLlamaForCausalLM"}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    load_tokenizer(layout).save_pretrained(tmp)  # checked against teacher.json first
    (tmp / "zerograph.json").write_text(json.dumps({**summary, "teacher_sha256": read_teacher_json(layout)["weights_sha256"]},
                                                   indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    Path(tmp).rename(out)
    return {"path": str(out), **{k: v for k, v in summary.items() if k != "blocks"}}

"""Assemble the trained blocks into a standard transformers model (``models/student/``).

Teacher embeddings + block layers renumbered in order + final norm + LM head, in the teacher
family's own causal-LM class (zgdata/families/registry.py). Uniform MLP widths and KV heads give a plain config of
that family that ``AutoModelForCausalLM.from_pretrained`` loads (``num_key_value_heads``: the kv_heads
conversion's count); per-layer widths, per-layer KV heads (``layer_kv_heads``), any sliding-window layer
(``layer_windows`` in config.json) or any linear layer in place of attention (``layer_attention``, the attn_linear
conversion) ship zg's modeling file for the family (zgtrain/student/load.py pins it). A mixture-of-experts student
with one expert count and top-k in every layer is the family's stock config; per-layer counts (``layer_experts``,
``layer_top_k``: the expert conversions) ship the modeling file too. zerograph.json records the windows and the KV-cache bytes per token
(zgtrain/block/kv_cache.py) next to the parameter counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from zgdata.core.atomic import atomic_path
from zgdata.core.lock import locked
from zgdata.errors import ZgError
from zgdata.families.registry import family_of
from zgdata.layout import Layout
from zgdata.lineage import check, expected_fingerprints
from zgdata.teacher.prepare import load_slice, load_tokenizer, read_teacher_json
from zgtrain.block.attention import teacher_kv_heads
from zgtrain.block.experts import idle_params
from zgtrain.block.kv_cache import kv_summary
from zgtrain.block.load import load_block
from zgtrain.fit.checkpoint import read_meta
from zgtrain.project.config import ProjectConfig
from zgtrain.student.card import write_card
from zgtrain.student.load import record_checksums, ship_modeling_code, template_class

__all__ = [
    "assemble",
    "build_student",
    "build_from_blocks",
    "save_student",
    "student_model",
    "write_student_files",
    "needs_modeling_code",
    "StudentResult",
]


@dataclass(frozen=True, kw_only=True)
class StudentResult:
    """A written student folder and its zerograph.json summary (less the per-block lineage)."""

    path: str
    """The student folder (models/student/, or models/search/student/ for the searched mix)."""
    params: int
    teacher_params: int
    param_ratio: float
    """params / teacher_params."""
    layers: int
    intermediate_sizes: list
    """Each layer's MLP width."""
    layer_windows: list
    """Each layer's sliding window (None: full attention)."""
    remote_code: bool
    """True when the folder ships zg's modeling file (per-layer widths or windows)."""
    family: str
    kv_context: int
    """The teacher's longest context, at which the KV-cache figures are counted (zgtrain/block/kv_cache.py)."""
    kv_bytes_per_token: float
    teacher_kv_bytes_per_token: float
    kv_ratio: float | None
    layer_kv_heads: list | None = None
    """Each layer's KV heads, where one differs from the teacher's (the kv_heads conversion); None otherwise."""
    layer_attention: list | None = None
    """Each layer's attention ("full", "linear": the attn_linear conversion, or "linear_attention[:W]": the
    linear_attention conversion), where one is not full; None otherwise."""
    layer_experts: list | None = None
    """A mixture-of-experts student's experts per layer (the expert conversions); None for a dense family."""
    layer_top_k: list | None = None
    """A mixture-of-experts student's experts run per token, per layer; None for a dense family."""
    active_params: int | None = None
    """A mixture-of-experts student's parameters one token runs (all but the experts its routers skip)."""
    linear_state_bytes: int | None = None
    """The linear_attention layers' constant generation state, bytes per sequence (zgtrain/block/kv_cache.py); None
    without such layers."""
    choice: dict | None = None
    """The searched student only: its mix ({block: variant or 'teacher'})."""
    search: dict | None = None
    """The searched student only: which try of the search loop it is and whether it passed the gates."""

    def metrics(self) -> dict:
        """Every field, less choice and search where they are None (what `zg train assemble --json` prints)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in _OPTIONAL or getattr(self, f.name) is not None
        }


_OPTIONAL = (
    "choice",
    "search",
    "layer_kv_heads",
    "layer_attention",
    "layer_experts",
    "layer_top_k",
    "active_params",
    "linear_state_bytes",
)


def _blocks(project: ProjectConfig, layout: Layout, which: str):
    part = project.partition
    want = expected_fingerprints(layout, part, project.materialize)
    out = []
    for spec in part.blocks():
        if read_meta(layout.block_dir(spec.key)) is None:
            raise ZgError(
                f"block {spec.key} is missing ({layout.block_dir(spec.key)})", fix=f"run `dvc repro train@{spec.key}`"
            )
        block, meta = load_block(layout, spec.key, which=which)
        check(
            f"block {spec.key}",
            meta["fingerprints"],
            "the current boundaries",
            want,
            keys=(spec.input, spec.output),
            fix=f"block {spec.key} is stale: run `dvc repro train@{spec.key}`",
        )
        out.append((spec, block, meta))
    return out


def build_student(project: ProjectConfig, *, layout: Layout = Layout(), which: str = "final"):
    """The assembled causal LM in memory (``which``: final or init weights) and a summary."""
    return build_from_blocks(_blocks(project, layout, which), layout=layout)


def needs_modeling_code(
    sizes: list,
    windows: list,
    kv_heads: list | None = None,
    attention: list | None = None,
    experts: list | None = None,
    top_k: list | None = None,
) -> bool:
    """Whether a student of these layer widths, windows, KV heads and attention kinds ships zg's modeling file
    (``remote_code``): per-layer MLP widths or KV heads, any sliding window or any linear layer in place of
    attention, per-layer expert counts or top-k, which the family's stock config cannot say."""
    return (
        len(set(sizes)) != 1
        or len(set(experts or [])) > 1
        or len(set(top_k or [])) > 1
        or any(w is not None for w in windows)
        or len(set(kv_heads or [])) > 1
        or any(a != "full" for a in (attention or []))
    )


def student_model(
    teacher_config: dict,
    state: dict,
    sizes: list,
    windows: list,
    types: list | None,
    kv_heads: list | None = None,
    attention: list | None = None,
    experts: list | None = None,
    top_k: list | None = None,
    *,
    dtype,
):
    """The student causal LM in eval mode, with the weights of ``state`` (the model's own keys: the family's
    ``head_key`` / ``layer_key`` names, layers renumbered 0..n-1), each ``.to(dtype).clone()``d and assigned.

    ``teacher_config``: the teacher's config dict; ``sizes``, ``windows``, ``types``: each student layer's MLP width,
    sliding window (None: full attention) and teacher attention type (Gemma 3; None where the family has one);
    ``kv_heads``: each layer's KV heads (None: the teacher's); ``attention``: each layer's "full" or "linear" (None:
    all full); ``experts`` / ``top_k``: a mixture-of-experts student's counts per layer. The family's
    ``student_config`` (with
    ``num_key_value_heads``: the layers' one count) where every width and KV head count is equal and no window is
    set, else zg's pinned template config and class (``intermediate_sizes``, ``layer_windows``, ``layer_kv_heads``;
    the folder then ships the modeling file). Built
    on the meta device; weights tied, a parameter ``state`` lacks is an error, derived buffers (rotary) rebuilt."""
    fam = family_of(teacher_config)
    moe = {"experts": experts, "top_k": top_k} if fam.moe is not None else {}
    config = fam.student_config(teacher_config, sizes, types, **moe)
    model_cls = fam.causal_lm()
    if kv_heads is not None and len(set(kv_heads)) == 1:  # one count: the stock config says it
        config.num_key_value_heads = int(kv_heads[0])
    if needs_modeling_code(sizes, windows, kv_heads, attention, experts, top_k):  # a config subclass + modeling code
        why = fam.check_template()
        if why:  # a verified decoder of another layout: the pinned template cannot rebuild its layers
            raise ZgError(
                f"this {fam.model_type} student has per-layer shapes (MLP widths, KV heads, windows or attention "
                f"kinds), which only zg's pinned modeling file says, and {why}",
                key="train.conversion",
                fix="give every block the same conversion and shape (a stock config then says it), "
                "or use a decoder with a record",
            )
        fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
        per_layer = {"layer_kv_heads": list(kv_heads)} if kv_heads is not None else {}
        if attention is not None:
            per_layer["layer_attention"] = list(attention)
        if fam.moe is not None:  # which config fields the template sets per layer, and their values
            per_layer["mlp_fields"] = {"width": fam.width_attr, "experts": fam.moe.experts, "top_k": fam.moe.top_k}
            per_layer.update(layer_experts=list(experts), layer_top_k=list(top_k))
        config = template_class(fam.model_type, "AutoConfig")(
            intermediate_sizes=sizes, layer_windows=windows, **per_layer, **fields
        )
        model_cls = template_class(fam.model_type, "AutoModelForCausalLM")
    for key, value in fam.load_kwargs().items():  # sdpa (Gemma 2: eager); MoE: zg's padded grouped_mm experts
        setattr(config, f"_{key}", value)
    with torch.device("meta"):
        model = model_cls(config)
    model.load_state_dict({k: v.to(dtype).clone() for k, v in state.items()}, assign=True, strict=False)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ZgError(f"assembled model lacks {missing[:3]}", fix="re-run `dvc repro teacher` and the train stages")
    fam.rebuild_buffers(model, config)  # derived buffers (rotary) off the meta device
    return model.eval()


def build_from_blocks(blocks: list, *, layout: Layout = Layout()):
    """The causal LM of ``blocks`` ([(BlockSpec, StudentBlock, meta)] in order) between the teacher's head slice."""
    head, hmeta = load_slice(layout.teacher_head)
    fam = family_of(hmeta["config"])
    sizes = [m for _, b, _ in blocks for m in b.intermediate_sizes]
    windows = [w for _, b, _ in blocks for w in b.windows]
    cache_windows = [w for _, b, _ in blocks for w in b.cache_windows()]  # a linear_attention layer's window
    types = [t for _, b, _ in blocks for t in (b.layer_types or [])] or None  # Gemma 3: each layer's teacher type
    kv_per_layer = [h for _, b, _ in blocks for h in b.kv_heads]  # None: the teacher's
    teacher_kv = teacher_kv_heads(family_of(hmeta["config"]).config_from_dict(hmeta["config"]))
    kv_heads = [teacher_kv if h is None else int(h) for h in kv_per_layer]
    changed = kv_heads != [teacher_kv] * len(kv_heads)  # only then recorded: other students' files stay as they were
    attention = [a or "full" for _, b, _ in blocks for a in b.attention]
    linear = any(a != "full" for a in attention)
    cache_heads = [0 if a == "linear" else h for a, h in zip(attention, kv_heads)]  # a linear layer caches nothing
    experts, top_k = _expert_counts(fam, hmeta["config"], blocks)
    state = {fam.head_key(k): v for k, v in head.items()}
    i = 0
    for _, block, _ in blocks:
        for j in range(len(block.layers)):
            for k, v in block.weights().items():
                if k.startswith(f"layers.{j}."):
                    state[fam.layer_key(i, k.split(".", 2)[2])] = v
            i += 1
    dtype = getattr(torch, hmeta["config"].get("dtype") or "float32")
    model = student_model(
        hmeta["config"],
        state,
        sizes,
        windows,
        types,
        kv_heads if changed else None,
        attention if linear else None,
        experts,
        top_k,
        dtype=dtype,
    )
    teacher_params = read_teacher_json(layout)["params"]
    n = sum(p.numel() for p in model.parameters())
    summary = {
        "params": n,
        "teacher_params": teacher_params,
        "param_ratio": n / teacher_params,
        "layers": len(sizes),
        "intermediate_sizes": sizes,
        "layer_windows": windows,
        "remote_code": needs_modeling_code(sizes, windows, kv_heads, attention, experts, top_k),
        "family": fam.model_type,
        **kv_summary(hmeta["config"], cache_windows, kv_heads=cache_heads, attention=attention),
        **({"layer_kv_heads": kv_heads} if changed else {}),
        **({"layer_attention": attention} if linear else {}),
        **(
            {"layer_experts": experts, "layer_top_k": top_k, "active_params": n - idle_params(fam.layers(model))}
            if experts is not None
            else {}
        ),
        "blocks": {
            spec.key: {
                "state_sha256": meta.get("state_sha256"),
                "fingerprints": meta["fingerprints"],
                "teacher_layers": meta["teacher_layers"],
            }
            for spec, _, meta in blocks
        },
    }
    return model, summary


def _expert_counts(fam, teacher_config: dict, blocks: list) -> tuple[list | None, list | None]:
    """Each layer's experts and top-k of a mixture-of-experts student (None, None for a dense family)."""
    if fam.moe is None:
        return None, None
    n, k = fam.experts(teacher_config), fam.top_k(teacher_config)
    experts = [n if e is None else int(e) for _, b, _ in blocks for e in b.experts]
    top_k = [min(e, k) if t is None else int(t) for e, t in zip(experts, (t for _, b, _ in blocks for t in b.top_k))]
    return experts, top_k


@locked("assemble")
def assemble(project: ProjectConfig, *, layout: Layout = Layout()) -> StudentResult:
    model, summary = build_student(project, layout=layout)
    return save_student(model, summary, layout.student, layout=layout)


def save_student(
    model, summary: dict, path: Path, *, layout: Layout = Layout(), judged: dict | None = None
) -> StudentResult:
    """Write an assembled model as a student folder (weights, shipped modeling code, tokenizer, zerograph.json,
    the model card README.md: zgtrain/student/card.py; ``judged``: figures this stage judged it by, for the card)."""
    teacher_sha = read_teacher_json(layout)["weights_sha256"]
    with atomic_path(path) as tmp:
        tokenizer = load_tokenizer(layout)  # checked against teacher.json first
        write_student_files(tmp, model, summary, tokenizer, teacher_sha256=teacher_sha)
        write_card(
            tmp,
            {**summary, "teacher_sha256": teacher_sha},
            layout=layout,  # README.md: docs, not weights
            kind="student" if Path(path) == layout.student else "search",
            judged=judged,
        )
        record_checksums(tmp)  # the weights' digests: load_student checks them on every load
    return StudentResult(path=str(path), **{k: v for k, v in summary.items() if k != "blocks"})


def write_student_files(folder: Path, model, summary: dict, tokenizer, *, teacher_sha256: str) -> str | None:
    """Write a student's loadable files into ``folder``, in this order: the weights and config (save_pretrained),
    zg's modeling file where ``summary["remote_code"]``, the tokenizer, then zerograph.json (``summary`` plus
    ``teacher_sha256`` and ``modeling_sha256``), the JSON save_student has always written. Returns the modeling
    file's sha256 (None: none shipped). The model card and checksums.json are the caller's (save_student)."""
    folder = Path(folder)
    model.save_pretrained(folder)
    modeling = ship_modeling_code(folder, summary["family"]) if summary["remote_code"] else None
    tokenizer.save_pretrained(folder)
    (folder / "zerograph.json").write_text(
        json.dumps({**summary, "teacher_sha256": teacher_sha256, "modeling_sha256": modeling}, indent=2, sort_keys=True)
        + "\n"
    )
    return modeling

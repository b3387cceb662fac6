"""How a student block starts from its teacher layers. An extensible registry.

Each conversion takes the block's teacher tensors (keys ``layers.{teacher_idx}.*``),
the teacher config, the train config, a deterministic sample of the block's input
boundary (for data-driven choices) and the block's generator, and returns a StudentBlock.
Family differences (MLP width, where the channels are, which tensors are norms) come
from the teacher's adapter in zgdata/families/registry.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zgdata.errors import ZgError
from zgdata.families.registry import family_of
from zgtrain.block import experts
from zgtrain.block.attention import (
    attention_heads,
    attention_io,
    check_attn_linear,
    check_linear_attention,
    fit_linear,
    group_kv_heads,
    kv_layer_config,
    linear_kind,
    resolve_kv_heads,
)
from zgtrain.block.model import StudentBlock
from zgtrain.project.names import CONVERSIONS  # the registry; params validation reads its names without torch

__all__ = ["CONVERSIONS", "register", "convert"]

Conversion = Callable[..., StudentBlock]


def register(name: str):
    """Make ``fn`` the conversion ``name`` (a built-in declared in zgtrain/project/names.py, or a new one)."""

    def deco(fn: Conversion) -> Conversion:
        CONVERSIONS[name] = fn
        return fn

    return deco


def _teacher_layers(tensors: dict) -> dict[int, dict[str, torch.Tensor]]:
    out: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        _, idx, rest = k.split(".", 2)
        out.setdefault(int(idx), {})[rest] = v
    return dict(sorted(out.items()))


def _load(block: StudentBlock, per_layer: list[dict[str, torch.Tensor]]) -> StudentBlock:
    state = {f"layers.{j}.{k}": v.float().clone() for j, layer in enumerate(per_layer) for k, v in layer.items()}
    missing, unexpected = block.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ZgError(
            f"teacher slice does not fit the student block (missing {missing[:3]}, unexpected {unexpected[:3]})",
            fix="re-run `dvc repro teacher` to rewrite the slices",
        )
    return block


def _types(config, tensors, keep=None) -> list[str] | None:
    """The teacher layers' attention types, where the family has several (Gemma 3); None otherwise."""
    idx = list(_teacher_layers(tensors))
    return family_of(config).layer_types(config, idx if keep is None else [idx[i] for i in keep])


@register("identity")
def identity(tensors, config, cfg, sample, gen) -> StudentBlock:
    layers = list(_teacher_layers(tensors).values())
    width = family_of(config).width(config)
    return _load(StudentBlock(config, [width] * len(layers), layer_types=_types(config, tensors)), layers)


@register("reinit")
def reinit(tensors, config, cfg, sample, gen) -> StudentBlock:
    n = len(_teacher_layers(tensors))
    fam = family_of(config)
    block = StudentBlock(config, [fam.width(config)] * n, layer_types=_types(config, tensors))
    with torch.no_grad():
        for name, p in block.named_parameters():
            if fam.is_layer_norm(name):  # norms start as identity: weight 1 (Gemma's 1 + w: 0), bias 0; no draw
                p.fill_(fam.norm_identity if name.endswith(".weight") else 0.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * config.initializer_range)
    return block


@register("drop_layers")
def drop_layers(tensors, config, cfg, sample, gen) -> StudentBlock:
    layers = list(_teacher_layers(tensors).values())
    keep = list(cfg.keep_layers)
    if not keep or sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= len(layers):
        raise ZgError(
            f"train.keep_layers is {keep} for a block of {len(layers)} layers",
            key="train.keep_layers",
            fix=f"give sorted offsets within [0, {len(layers) - 1}], e.g. [0, {len(layers) - 1}]",
        )
    block = StudentBlock(
        config, [family_of(config).width(config)] * len(keep), layer_types=_types(config, tensors, keep)
    )
    return _load(block, [layers[i] for i in keep])


@register("prune_mlp")
def prune_mlp(tensors, config, cfg, sample, gen) -> StudentBlock:
    """Keep the MLP channels with the largest mean |activation| on the block's own input data."""
    full = identity(tensors, config, cfg, sample, gen)
    with torch.no_grad():
        acts = full.mlp_activations(sample)  # per layer: (B, T, I)
    fam = family_of(config)
    keep_n = max(1, round(fam.width(config) * (1 - cfg.prune_ratio)))
    layers = list(_teacher_layers(tensors).values())
    pruned = []
    for layer, act in zip(layers, acts):
        score = act.abs().double().mean(dim=(0, 1))  # (I,)
        # stable sort on (-score, index): ties resolve by channel index, deterministically
        order = torch.sort(-score, stable=True).indices[:keep_n]
        idx = torch.sort(order).values
        pruned.append(fam.prune_mlp(layer, idx))  # Llama: gate/up rows, down columns; GPT-2: Conv1D + biases
    return _load(StudentBlock(config, [keep_n] * len(layers), layer_types=_types(config, tensors)), pruned)


@register("window_attention")
def window_attention(tensors, config, cfg, sample, gen) -> StudentBlock:
    """The teacher's layers copied whole; each layer's attention sees only its last ``train.window`` tokens."""
    layers = list(_teacher_layers(tensors).values())
    n, width = len(layers), family_of(config).width(config)
    return _load(StudentBlock(config, [width] * n, [cfg.window] * n, _types(config, tensors)), layers)


@register("kv_heads")
def kv_heads(tensors, config, cfg, sample, gen) -> StudentBlock:
    """The teacher's layers with ``train.kv_heads`` key/value heads each (0: half the teacher's), each new head
    the mean of a contiguous group of the teacher's (zgtrain/block/attention.py)."""
    n = resolve_kv_heads(config, cfg.kv_heads)
    layers = [group_kv_heads(layer, config, n) for layer in _teacher_layers(tensors).values()]
    width = family_of(config).width(config)
    block = StudentBlock(config, [width] * len(layers), layer_types=_types(config, tensors), kv_heads=[n] * len(layers))
    return _load(block, layers)


@register("attn_linear")
def attn_linear(tensors, config, cfg, sample, gen) -> StudentBlock:
    """Each layer's attention replaced by one linear map of its normed input (no token mixing, no KV cache), fitted
    by least squares to the teacher attention's output on the block's input sample, layer after layer on the
    student's own running input (zgtrain/block/attention.py says when this helps). The rest is the teacher's."""
    check_attn_linear(config)
    teacher = identity(tensors, config, cfg, sample, gen).eval()
    layers = list(_teacher_layers(tensors).values())
    n, fam = len(layers), family_of(config)
    block = StudentBlock(config, [fam.width(config)] * n, layer_types=_types(config, tensors), attention=["linear"] * n)
    kept = [{k: v for k, v in layer.items() if not k.startswith("self_attn.")} for layer in layers]
    with torch.no_grad():
        h = sample.float()
        inputs = fam.layer_inputs(getattr(teacher, "rotary_emb", None), h)
        for j in range(n):
            x, y, _ = attention_io(fam, teacher.layers[j], h, inputs)
            w, b = fit_linear(x, y)
            kept[j] = {**kept[j], "self_attn.linear.weight": w, "self_attn.linear.bias": b}
            block.layers[j].load_state_dict({k: v.clone() for k, v in kept[j].items()})
            h = fam.call_layer(block.layers[j], h, inputs)  # the next layer is fitted on the student's own input
    return _load(block, kept)


@register("linear_attention")
def linear_attention(tensors, config, cfg, sample, gen) -> StudentBlock:
    """Each layer's attention linearized with learned feature maps over the teacher's own q/k/v/o (Hedgehog, as
    in LoLCATs), plus exact softmax over the last ``train.linear_window`` positions (0: none). The feature maps
    start as the identity map (no draw); train.py first fits them alone to each layer's teacher attention output
    (``train.transfer_steps``), then trains the whole block on its boundary pair (zgtrain/block/attention.py)."""
    layers = list(_teacher_layers(tensors).values())
    n, fam = len(layers), family_of(config)
    teacher = identity(tensors, config, cfg, sample, gen)
    check_linear_attention(config, teacher.layers[0])
    kinds = [linear_kind(cfg.linear_window)] * n
    block = StudentBlock(config, [fam.width(config)] * n, layer_types=_types(config, tensors), attention=kinds)
    _load_partial(block, layers)
    return block


@register("prune_experts")
def prune_experts(tensors, config, cfg, sample, gen) -> StudentBlock:
    """A mixture-of-experts block keeping ``train.keep_experts`` experts per layer, by routing mass on its own input
    sample; the router's rows follow and top-k is clamped (zgtrain/block/experts.py)."""
    experts.require_moe("prune_experts", config)
    teacher = identity(tensors, config, cfg, sample, gen)
    layers = list(_teacher_layers(tensors).values())
    return _load(*experts.prune_experts(config, cfg, sample, teacher, layers, _types(config, tensors)))


@register("moe_to_dense")
def moe_to_dense(tensors, config, cfg, sample, gen) -> StudentBlock:
    """A mixture-of-experts block whose routed experts become one dense MLP of ``train.dense_width`` channels per
    layer, initialised from the experts (``train.dense_init``; zgtrain/block/experts.py)."""
    experts.require_moe("moe_to_dense", config)
    teacher = identity(tensors, config, cfg, sample, gen)
    layers = list(_teacher_layers(tensors).values())
    return _load(*experts.moe_to_dense(config, cfg, sample, teacher, layers, _types(config, tensors)))


def _load_partial(block: StudentBlock, per_layer: list[dict[str, torch.Tensor]]) -> None:
    """The teacher's tensors into ``block``, whose only other parameters are new ones (feature maps) kept as built."""
    state = {f"layers.{j}.{k}": v.float().clone() for j, layer in enumerate(per_layer) for k, v in layer.items()}
    _, unexpected = block.load_state_dict(state, strict=False)
    if unexpected:
        raise ZgError(
            f"teacher slice does not fit the student block (unexpected {unexpected[:3]})",
            fix="re-run `dvc repro teacher` to rewrite the slices",
        )


_unbuilt = [name for name, fn in CONVERSIONS.items() if fn is None]
if _unbuilt:  # a name declared in zgtrain/project/names.py needs its function here
    raise ImportError(f"conversions declared without a registered function: {', '.join(_unbuilt)}")


def convert(name: str, tensors, config, cfg, sample: torch.Tensor, gen: torch.Generator) -> StudentBlock:
    if CONVERSIONS.get(name) is None:
        raise ZgError(
            f"unknown conversion '{name}'", key="train.conversion", fix=f"use one of {', '.join(CONVERSIONS)}"
        )
    _require_parts(name, config)
    return CONVERSIONS[name](tensors, config, cfg, sample, gen)


_ATTENTION_CONVERSIONS = ("kv_heads", "window_attention", "attn_linear", "linear_attention")


def _require_parts(name: str, config) -> None:
    """A decoder verified at prepare (no record) runs a conversion only where discovery found the parts it edits;
    otherwise one line names what is missing (the block's stage stops there, the others run)."""
    fam = family_of(config)
    if fam.moe is not None and name == "prune_mlp":
        raise ZgError(
            f"the prune_mlp conversion needs {fam.mlp_missing()}",
            key="train.conversion",
            fix="choose prune_experts (fewer experts) or moe_to_dense (one dense MLP) for this block",
        )
    if not fam.verified:
        return
    missing = fam.mlp_missing() if name == "prune_mlp" else None
    if name in _ATTENTION_CONVERSIONS and fam.attention_name() != "self_attn":
        missing = f"an attention module `self_attn` in each layer (this one's is {fam.attention_name() or 'not found'})"
    elif name == "kv_heads":
        missing = _kv_projections(fam, config)
    if missing:
        raise ZgError(
            f"the {name} conversion needs {missing}, which zg did not find in this {fam.model_type} teacher",
            key="train.conversion",
            fix="choose another conversion for this block (identity, drop_layers, reinit, prune_mlp work on every "
            "verified decoder), or give the family a record (docs/tutorials/convert-your-model.md#model-families)",
        )


def _kv_projections(fam, config) -> str | None:
    """None where a layer built with one KV head has key and value projections of one head: the config's
    ``num_key_value_heads`` sizes them, so grouping heads (zgtrain/block/attention.py) builds a layer that fits."""
    heads, kv, hd = attention_heads(config)
    if kv == 1:
        return None  # nothing to group: kv_heads keeps the one head
    types = fam.layer_types(config, [0])
    with torch.device("meta"):
        layer = fam.make_layer(kv_layer_config(fam.layer_config(config, fam.width(config)), 1), 0, types and types[0])
    attn = layer.self_attn
    k, v, qkv = (getattr(attn, n, None) for n in ("k_proj", "v_proj", "qkv_proj"))
    if k is not None and v is not None and getattr(k, "out_features", 0) == getattr(v, "out_features", 0) == hd:
        return None
    if qkv is not None and getattr(qkv, "out_features", 0) == (heads + 2) * hd:
        return None
    return "key/value projections (k_proj and v_proj, or qkv_proj) sized by num_key_value_heads"

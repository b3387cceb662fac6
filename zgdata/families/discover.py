"""Find a decoder's parts from the model itself: no table of module names.

For a model type without a record (zgdata/families/traits.py, registry.py), ``discover`` reads the causal LM's own
structure, built on the meta device from its config (no weight is allocated):
- the decoder is ``get_decoder()``, the head ``get_output_embeddings()``, the token embedding
  ``get_input_embeddings()``; the layers are the decoder's one ModuleList as long as ``num_hidden_layers``, all of
  one class; the rotary module is the parameter-free child whose forward takes ``position_ids``; the final norm is
  the one child left (dropout aside). Anything else in the decoder has no known place in the forward: refused;
- in a layer, the attention is the child whose forward takes ``attention_mask``, the MLP the other child holding
  linear maps; its output projection maps width W to hidden, its input projections hidden to W (or 2W: gate and
  up fused); the config field of W is the one that, set to W/2, builds a layer whose MLP is W/2 wide;
- the layer norms are the leaf modules with only 1-D parameters; whether a norm scales by ``w`` or ``1 + w`` is
  read from what a norm with zero weight does.

Discovery is a guess that a check makes safe: ``zg teacher prepare`` runs the identity round trip
(zgdata/families/selfcheck.py) and refuses a teacher whose round trip is not bitwise. What discovery cannot find
is ``None`` in ``Parts``, and each conversion that needs it is refused per block, naming what is missing.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from dataclasses import dataclass

import torch

from zgdata.errors import ZgError

__all__ = ["Parts", "PartError", "discover", "discover_config", "causal_lm_name", "config_name"]


class PartError(ZgError):
    """A part of the decoder discovery or the self-check could not find or reproduce (``part``: which)."""

    def __init__(self, part: str, what: str, fix: str):
        self.part = part
        super().__init__(f"{part}: {what}", key="teacher.source", fix=fix)


@dataclass(frozen=True)
class Parts:
    """Where a decoder's pieces are (attribute names) and what they are (classes as (module, name))."""

    base: str  # the decoder inside the causal LM
    head: str  # the output head inside the causal LM
    embed: str  # token embedding inside ``base``
    layers: str  # ModuleList of decoder layers inside ``base``
    norm: str  # final norm inside ``base``
    rotary: str | None  # position module inside ``base`` (None: no rotary)
    layer_class: tuple[str, str]
    rotary_class: tuple[str, str] | None
    rotary_per_type: bool  # the rotary takes a layer type (one per attention type)
    attn: str | None  # the attention module inside a layer
    norms: tuple[str, ...]  # norm modules inside a layer
    norm_identity: float  # the norm weight that scales by 1
    width_attr: str | None  # config field of the MLP width (None: not found)
    mlp_out: str | None  # the MLP's output projection inside a layer
    mlp_channels: tuple[tuple[str, int], ...]  # (layer tensor, dim indexing MLP channels)
    fused_gate_up: bool  # one input projection of 2W rows: [gate; up]
    why_no_mlp: str | None  # what was missing, where width_attr is None


def _names(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return CONFIG_MAPPING_NAMES.get(model_type), MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def config_name(model_type: str) -> str | None:
    """transformers' config class name of a model type (None: transformers does not know it)."""
    return _names(model_type)[0]


def causal_lm_name(model_type: str) -> str | None:
    """transformers' causal-LM class name of a model type (None: it has none)."""
    return _names(model_type)[1]


def _where(cls) -> tuple[str, str]:
    return cls.__module__, cls.__name__


def _child_name(parent: torch.nn.Module, child) -> str | None:
    return next((n for n, m in parent.named_children() if m is child), None)


def _takes(module: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(module.forward).parameters


def _fail(part: str, what: str) -> PartError:
    return PartError(part, what, fix="this decoder needs a record of its own: see docs/tutorials/convert-your-model.md")


def _decoder(model, config) -> tuple[str, str, str, str, str, str | None]:
    """(base, head, embed, layers, norm, rotary) attribute names."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else None
    base = _child_name(model, inner) if inner is not None and inner is not model else None
    if base is None:
        raise _fail("decoder", f"{type(model).__name__} has no base decoder (get_decoder()) among its modules")
    head = _child_name(model, model.get_output_embeddings())
    if head is None:
        raise _fail("head", f"{type(model).__name__} has no output head (get_output_embeddings()) of its own")
    embed = _child_name(inner, model.get_input_embeddings())
    if embed is None:
        raise _fail("embedding", f"{type(inner).__name__} holds no token embedding (get_input_embeddings())")
    n = config.num_hidden_layers
    lists = [k for k, m in inner.named_children() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if len(lists) != 1:
        raise _fail("layers", f"{type(inner).__name__} has {len(lists)} module lists of {n} layers, not one")
    layers = getattr(inner, lists[0])
    if len({type(m) for m in layers}) != 1:
        raise _fail("layers", f"the layers of {type(inner).__name__} are of several classes")
    rest = {k: m for k, m in inner.named_children() if k not in (embed, lists[0])}
    rotary = [k for k, m in rest.items() if not list(m.parameters()) and _takes(m, "position_ids")]
    if len(rotary) > 1:
        raise _fail("embedding", f"{type(inner).__name__} has several position modules ({', '.join(rotary)})")
    left = [k for k, m in rest.items() if k not in rotary and not isinstance(m, torch.nn.Dropout)]
    if len(left) != 1:
        what = f"modules {', '.join(left)} beside" if left else "no final norm after"
        raise _fail("norm", f"{type(inner).__name__} has {what} its embedding and layers")
    return base, head, embed, lists[0], left[0], rotary[0] if rotary else None


def _norms(layer: torch.nn.Module) -> tuple[str, ...]:
    out = []
    for name, m in layer.named_modules():
        params = list(m.parameters(recurse=False))
        # a norm's parameters are vectors (a learned activation's are scalars: Apertus' xIELU)
        if name and params and not list(m.children()) and all(p.dim() == 1 and p.numel() > 1 for p in params):
            out.append(name)
    return tuple(out)


def _norm_identity(layer: torch.nn.Module, norms: tuple[str, ...]) -> float:
    """1.0, or 0.0 where a norm with zero weight still passes its input (it scales by 1 + w: Gemma's)."""
    if not norms:
        return 1.0
    norm = copy.deepcopy(layer.get_submodule(norms[0])).to_empty(device="cpu")
    with torch.no_grad():
        for p in norm.parameters():
            p.zero_()
        x = torch.randn(2, norm.weight.shape[0] if hasattr(norm, "weight") else 8, generator=torch.Generator())
        try:
            out = norm(x)
        except Exception:  # a norm over another shape: assume the usual scale
            return 1.0
    return 0.0 if bool(out.abs().sum() > 0) else 1.0


def _mlp(model_cls, config, layer, hidden: int, attn: str | None):
    """(width_attr, mlp_out, mlp_channels, fused, why not)."""
    kids = [
        (k, m)
        for k, m in layer.named_children()
        if k != attn and any(isinstance(x, torch.nn.Linear) for x in m.modules())
    ]
    if len(kids) != 1:
        return None, None, (), False, f"{len(kids)} MLP-like children in the layer, not one"
    name, mlp = kids[0]
    linears = {k: m for k, m in mlp.named_modules() if isinstance(m, torch.nn.Linear)}
    outs = [k for k, m in linears.items() if m.out_features == hidden and m.in_features != hidden]
    if len(outs) != 1:
        return None, None, (), False, "no single output projection to the hidden size in the MLP"
    width = linears[outs[0]].in_features
    ins = {k: m.out_features for k, m in linears.items() if k != outs[0] and m.in_features == hidden}
    fused = set(ins.values()) == {2 * width}
    if not ins or not (set(ins.values()) == {width} or fused) or len(ins) + 1 != len(linears):
        return None, None, (), False, f"the MLP's input projections are not {width} (or fused {2 * width}) wide"
    fields = [k for k, v in config.to_dict().items() if v == width and type(v) is int]
    attr = next((f for f in fields if _builds_width(model_cls, config, layer, f, width // 2, name, outs[0])), None)
    if attr is None:
        return None, None, (), False, f"no config field sets the MLP width ({width})"
    chans = [(f"{name}.{k}.{p}", 0) for k in ins for p in ("weight", "bias") if getattr(linears[k], p) is not None]
    chans.append((f"{name}.{outs[0]}.weight", 1))
    return attr, f"{name}.{outs[0]}", tuple(chans), fused, None


def _builds_width(model_cls, config, layer, field: str, width: int, mlp: str, out: str) -> bool:
    cfg = copy.deepcopy(config)
    setattr(cfg, field, width)
    try:
        with torch.device("meta"):
            built = type(layer)(cfg, layer_idx=0)
        return built.get_submodule(f"{mlp}.{out}").in_features == width
    except Exception:
        return False


def discover(model) -> Parts:
    """The parts of a causal LM (real or on the meta device), or a PartError naming the part not found."""
    config = model.config
    base, head, embed, layers_attr, norm, rotary = _decoder(model, config)
    inner = getattr(model, base)
    layer = getattr(inner, layers_attr)[0]
    rot = getattr(inner, rotary) if rotary else None
    attns = [k for k, m in layer.named_children() if _takes(m, "attention_mask")]
    attn = attns[0] if len(attns) == 1 else None
    norms = _norms(layer)
    width_attr, mlp_out, chans, fused, why = _mlp(type(model), config, layer, config.hidden_size, attn)
    return Parts(
        base=base,
        head=head,
        embed=embed,
        layers=layers_attr,
        norm=norm,
        rotary=rotary,
        layer_class=_where(type(layer)),
        rotary_class=_where(type(rot)) if rot is not None else None,
        rotary_per_type=rot is not None and _takes(rot, "layer_type"),
        attn=attn,
        norms=norms,
        norm_identity=_norm_identity(layer, norms),
        width_attr=width_attr,
        mlp_out=mlp_out,
        mlp_channels=chans,
        fused_gate_up=fused,
        why_no_mlp=why,
    )


@functools.lru_cache(maxsize=64)
def _discover_json(model_type: str, config_json: str) -> Parts:
    import transformers

    config = getattr(transformers, config_name(model_type)).from_dict(json.loads(config_json))
    with torch.device("meta"):
        model = getattr(transformers, causal_lm_name(model_type))(config)
    parts = discover(model)
    if parts.width_attr is None:  # an MLP as wide as the hidden size (a pruned student) hides which map is which
        for field in _hidden_wide_fields(config):
            wider = copy.deepcopy(config)
            setattr(wider, field, 3 * config.hidden_size)  # names do not depend on the width: find them apart
            with torch.device("meta"):
                found = discover(getattr(transformers, causal_lm_name(model_type))(wider))
            if found.width_attr == field:
                return found
    return parts


def _hidden_wide_fields(config) -> list[str]:
    hidden = config.hidden_size
    aliases = {k for k, v in getattr(config, "attribute_map", {}).items() if v == "hidden_size"} | {"hidden_size"}
    return [k for k, v in config.to_dict().items() if type(v) is int and v == hidden and k not in aliases]


def discover_config(model_type: str, config) -> Parts:
    """``discover`` of the causal LM a config (object or dict) builds, on the meta device; memoized per config."""
    d = config if isinstance(config, dict) else config.to_dict()
    d = {k: v for k, v in d.items() if k not in ("auto_map", "architectures", "_name_or_path", "model_type")}
    return _discover_json(model_type, json.dumps(d, sort_keys=True, default=str))

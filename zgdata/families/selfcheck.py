"""The self-check that trusts a decoder without a record: the identity round trip, bit for bit, at prepare.

On a probe batch (several sequences, one ending in the tokenizer's padding, as packed eval sets do) the teacher's
own forward is recorded with hooks: the input of every decoder layer (boundary k), the input and output of the final
norm, and the logits. Then the adapter (zgdata/families/verified.py) must give the same bits, part by part:
- ``embedding``: boundary 0 from the model's embedding module, and from the head slice's tensors (evaluate, shift);
- ``layer i``: boundary i+1 from boundary i through the layer called as the adapter calls it; and, for i > 0, through
  the layer rebuilt as a block's first (index 0, as zgtrain/block/model.py builds a block): a layer whose forward
  depends on its index (DiffLlama's ``lambda_init``) computes another function in every block but the first;
- ``norm`` and ``head``: the final norm of the last boundary, then the logits;
- ``student``: the identity student's config (``student_config``) built and loaded with the teacher's tensors
  gives the teacher's logits (the assembled student of identity blocks);
- ``mlp``: pruning every MLP channel of a layer (full width) gives the same tensors, pruning half of them builds a
  layer of the family at that width whose output tracks the full layer's with the dropped channels silenced.
The first part that differs is named in a one-line refusal. The verdict, the probe's digest and the transformers
version go into teacher.json (``verified``).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import torch

from zgdata.families.discover import PartError

__all__ = ["self_check", "probe_ids"]

FIX = "this decoder needs a record of its own (docs/tutorials/convert-your-model.md#model-families)"
PROBE = (3, 40)  # sequences x tokens


def probe_ids(vocab_size: int, pad_id: int | None) -> torch.Tensor:
    """The probe batch: fixed random tokens; the last row ends in padding where the tokenizer has a pad token."""
    ids = torch.randint(0, vocab_size, PROBE, generator=torch.Generator().manual_seed(20261203))
    if pad_id is not None and 0 <= pad_id < vocab_size:
        ids[-1, -PROBE[1] // 4 :] = pad_id
    return ids


def _differ(part: str, what: str) -> PartError:
    return PartError(part, f"the adapter's result differs from the teacher's own forward ({what})", fix=FIX)


def _raised(part: str, e: Exception) -> PartError:
    first = (str(e).splitlines() or [""])[0][:160]
    return PartError(part, f"running it the way zg does raised {type(e).__name__}: {first}", fix=FIX)


@torch.no_grad()
def _reference(model, fam, ids) -> dict:
    """The teacher's own forward, with every layer's input, the norm's input and output, and the logits."""
    seen: dict = {"layers": [], "norm": []}
    hooks = [
        layer.register_forward_pre_hook(
            lambda m, args, kwargs: seen["layers"].append(kwargs.get("hidden_states", args[0] if args else None)),
            with_kwargs=True,
        )
        for layer in fam.layers(model)
    ]
    norm = fam.final_norm(model)
    hooks.append(norm.register_forward_hook(lambda m, args, out: seen["norm"].append((args[0], out))))
    try:
        seen["logits"] = model(input_ids=ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def _round_trip(model, fam, ids, ref) -> None:
    from zgdata.families.capture import capture

    n = len(fam.layers(model))
    if len(ref["layers"]) != n or len(ref["norm"]) != 1:
        raise _differ("layers", f"the forward called {len(ref['layers'])} of {n} layers, the norm {len(ref['norm'])}x")
    dtype = next(model.parameters()).dtype
    try:
        got = capture(model, ids, list(range(n + 1)), storage_dtype=dtype)
    except Exception as e:
        raise _raised("layers", e) from e
    for k in range(n + 1):
        want = ref["layers"][k] if k < n else ref["norm"][0][0]
        if not torch.equal(got[k], want.cpu()):
            raise _differ("embedding" if k == 0 else f"layer {k - 1}", f"boundary {k}")
    normed = fam.final_norm(model)(got[n].to(ref["norm"][0][0].device))
    if not torch.equal(normed, ref["norm"][0][1]):
        raise _differ("norm", "the final norm of the last boundary")
    logits = fam.finish_logits(model.get_output_embeddings()(normed))
    if not torch.equal(logits, ref["logits"]):
        raise _differ("head", "the logits of the final norm's output")
    layers, head = fam.split_state(model.state_dict())
    if not torch.equal(fam.embed_head(head, ids), got[0]):
        raise _differ("embedding", "boundary 0 from the head slice's tensors")
    _renumbered(model, fam, layers, got)


@torch.no_grad()
def _renumbered(model, fam, layers: list[dict], got: list[torch.Tensor]) -> None:
    """Each layer but the first, rebuilt at index 0 with its tensors, gives its own boundary bit for bit: a block's
    layers are numbered from 0, and an assembled student renumbers them again after dropped layers."""
    config = model.config
    cfg = fam.layer_config(config, fam.width(config))
    dtype = next(model.parameters()).dtype
    inputs = fam.layer_inputs(fam.rotary(cfg), got[0])
    for k in range(1, len(layers)):
        try:
            types = fam.layer_types(config, [k])
            layer = fam.make_layer(cfg, 0, types and types[0]).to(dtype).eval()
            layer.load_state_dict(layers[k], strict=True)
            out = fam.call_layer(layer, got[k], inputs)
        except Exception as e:
            raise _raised(f"layer {k}", e) from e
        if not torch.equal(out, got[k + 1]):
            raise PartError(
                f"layer {k}",
                "its result depends on its index in the model: rebuilt as a block's first layer it differs from the "
                "teacher's own forward (zg's blocks number their layers from 0)",
                fix=FIX,
            )


@torch.no_grad()
def _student(model, fam, ids, ref) -> None:
    config = model.config
    n = config.num_hidden_layers
    try:
        cfg = fam.student_config(config.to_dict(), [fam.width(config)] * n, fam.layer_types(config, list(range(n))))
        cfg._attn_implementation = fam.attn_implementation
        with torch.device("meta"):
            student = type(model)(cfg)
        student.load_state_dict(model.state_dict(), assign=True, strict=True)
        student.tie_weights()
        fam.rebuild_buffers(student, cfg)
        logits = student.eval()(input_ids=ids, use_cache=False).logits
    except Exception as e:
        raise _raised("student", e) from e
    if not torch.equal(logits, ref["logits"]):
        raise _differ("student", "the identity student's logits")


@torch.no_grad()
def _mlp(model, fam, ids) -> None:
    config = model.config
    layers, _ = fam.split_state(model.state_dict())
    first = {k: v.float() for k, v in layers[0].items()}
    width = fam.width(config)
    if not all(name in first for name in fam.mlp_channels if name.endswith(".weight")):
        raise _differ("mlp", "the MLP tensors found are not all in the layer's state")
    full = fam.prune_mlp(first, torch.arange(width))
    if full.keys() != first.keys() or not all(torch.equal(full[k], first[k]) for k in first):
        raise _differ("mlp", "pruning every channel changed the layer's tensors")
    keep = torch.arange(0, width, 2)
    try:
        types = fam.layer_types(config, [0])
        whole = fam.make_layer(fam.layer_config(config, width), 0, types and types[0]).float().eval()
        whole.load_state_dict(first)
        half = fam.make_layer(fam.layer_config(config, len(keep)), 0, types and types[0]).float().eval()
        half.load_state_dict(fam.prune_mlp(first, keep), strict=True)
        h = fam.embed(fam.inner(model), ids).float()
        inputs = fam.layer_inputs(fam.rotary(fam.layer_config(config, width)), h)
        mask = torch.zeros(width).index_fill_(0, keep, 1.0)
        hook = whole.get_submodule(fam.mlp_out).register_forward_pre_hook(lambda m, a: (a[0] * mask,))
        try:
            silenced = fam.call_layer(whole, h, inputs)
        finally:
            hook.remove()
        pruned = fam.call_layer(half, h, inputs)
    except Exception as e:
        raise _raised("mlp", e) from e
    # a layout check, not a bitwise one: a wrong channel map is off by the layer's whole MLP output, not by rounding
    if not torch.allclose(pruned, silenced, rtol=1e-3, atol=1e-4):
        raise _differ("mlp", "a half-width prune does not equal the layer with those channels silenced")


def self_check(model, fam, tok) -> dict:
    """The verdict of the identity round trip of ``model`` through adapter ``fam`` (PartError where a part differs)."""
    import transformers

    ids = probe_ids(model.config.vocab_size, getattr(tok, "pad_token_id", None))
    before = model.config._attn_implementation
    model.config._attn_implementation = fam.attn_implementation
    try:
        try:
            ref = _reference(model.eval(), fam, ids)
        except Exception as e:
            raise _raised("forward", e) from e
        _round_trip(model, fam, ids, ref)
        _student(model, fam, ids, ref)
        _mlp(model, fam, ids)
    finally:
        model.config._attn_implementation = before
    parts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(fam.parts).items()}
    return {
        "verdict": "pass",
        "checks": ["embedding", "layers", "norm", "head", "student", "mlp"],
        "probe": {"shape": list(ids.shape), "sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest()},
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "parts": parts,
    }

"""Capture teacher boundaries: the residual stream entering decoder layer k.

Boundary L (the number of layers) is the last layer's output *before* the final norm;
transformers' ``hidden_states[-1]`` is after it, so we run the layers ourselves with the
model's own modules, as its family's adapter (zgdata/families/registry.py) says: embedding (GPT-2
adds learned positions), per-forward position inputs, and the layer call. With sdpa
attention and no mask this is bit-identical to the model's forward (tested per family),
and it lets online targets stop at the block's output layer.
"""

from __future__ import annotations

import torch

from zgdata.capture_version import CAPTURE_VERSION
from zgdata.errors import ZgError
from zgdata.families.registry import family_of
from zgdata.families.widen import compute_dtype, widened

__all__ = ["capture", "CAPTURE_VERSION", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "sdpa"


@torch.no_grad()
def capture(
    model, input_ids: torch.Tensor, layers: list[int], *, storage_dtype: torch.dtype
) -> dict[int, torch.Tensor]:
    """{layer: (B, T, C) boundary in ``storage_dtype``} for each requested layer. Runs only as deep as needed."""
    fam = family_of(model.config)
    # attention: ATTN_IMPLEMENTATION but for families transformers runs only eager (Gemma 2); MoE: zg's padded grouped_mm experts
    for key, want in fam.load_kwargs().items():
        have = getattr(model.config, f"_{key}", None)
        if have != want:
            raise ZgError(
                f"teacher {key} is '{have}', capture needs '{want}'",
                fix="load the teacher with zgdata.teacher.prepare.load_teacher",
            )
    inner, blocks = fam.inner(model), fam.layers(model)
    depth = len(blocks)
    if max(layers) > depth or min(layers) < 0:
        raise ZgError(
            f"boundary layers {layers} are outside [0, {depth}]",
            key="partition.boundaries",
            fix=f"keep every boundary within [0, {depth}]",
        )
    want = set(layers)
    wide = compute_dtype(model)  # a teacher loaded per_layer: widen what runs, while it runs (zgdata.families.widen)
    with widened([m for m in inner.children() if m is not blocks], wide):
        first = next(inner.parameters())
        input_ids = input_ids.to(first.device)
        h = fam.embed(inner, input_ids).to(first.dtype)  # (B, T, C)
        inputs = fam.layer_inputs(fam.model_rotary(inner), h)  # e.g. rotary cos, sin: (1, T, D)
    out = {0: h.to(storage_dtype)} if 0 in want else {}
    for i in range(max(layers)):
        with widened([blocks[i]], wide):
            h = fam.call_layer(blocks[i], h, inputs)
        if i + 1 in want:
            out[i + 1] = h.to(storage_dtype)
    return {k: v.cpu() for k, v in out.items()}

"""Capture teacher boundaries: the residual stream entering decoder layer k.

Boundary L (the number of layers) is the last layer's output *before* the final norm;
transformers' ``hidden_states[-1]`` is after it, so we run the layers ourselves with the
model's own modules. With sdpa attention and no mask this is bit-identical to the
model's forward (tested), and it lets online targets stop at the block's output layer.
"""

from __future__ import annotations

import torch

from zgdata.capture_version import CAPTURE_VERSION
from zgdata.errors import ZgError

__all__ = ["capture", "CAPTURE_VERSION", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "sdpa"


@torch.no_grad()
def capture(model, input_ids: torch.Tensor, layers: list[int], *, storage_dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """{layer: (B, T, C) boundary in ``storage_dtype``} for each requested layer. Runs only as deep as needed."""
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ZgError(f"teacher attention is '{model.config._attn_implementation}', capture needs "
                      f"'{ATTN_IMPLEMENTATION}'", fix="load the teacher with zgdata.teacher.load_teacher")
    inner = model.model
    depth = len(inner.layers)
    if max(layers) > depth or min(layers) < 0:
        raise ZgError(f"boundary layers {layers} are outside [0, {depth}]", key="partition.boundaries",
                      fix=f"keep every boundary within [0, {depth}]")
    want = set(layers)
    dtype = next(inner.parameters()).dtype
    input_ids = input_ids.to(inner.embed_tokens.weight.device)
    h = inner.embed_tokens(input_ids).to(dtype)                          # (B, T, C)
    pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, T)
    pe = inner.rotary_emb(h, position_ids=pos)                            # cos, sin: (1, T, D)
    out = {0: h.to(storage_dtype)} if 0 in want else {}
    for i in range(max(layers)):
        h = inner.layers[i](h, attention_mask=None, position_embeddings=pe, position_ids=pos)
        if i + 1 in want:
            out[i + 1] = h.to(storage_dtype)
    return {k: v.cpu() for k, v in out.items()}

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

__all__ = ["capture", "capture_rows", "CAPTURE_VERSION", "ATTN_IMPLEMENTATION"]

ATTN_IMPLEMENTATION = "sdpa"


@torch.no_grad()
def capture(
    model, input_ids: torch.Tensor, layers: list[int], *, storage_dtype: torch.dtype, on_device: bool = False
) -> dict[int, torch.Tensor]:
    """{layer: (B, T, C) boundary in ``storage_dtype``} for each requested layer. Runs only as deep as needed.

    ``on_device``: leave the boundaries on the teacher's device (a GPU's forward may still be running when this
    returns; zgdata.core.host_copy moves them while the next one runs); else they come back on the CPU."""
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
        input_ids = _ids_to(input_ids, first.device)
        h = fam.embed(inner, input_ids).to(first.dtype)  # (B, T, C)
        inputs = fam.layer_inputs(fam.model_rotary(inner), h)  # e.g. rotary cos, sin: (1, T, D)
    out = {0: h.to(storage_dtype)} if 0 in want else {}
    for i in range(max(layers)):
        with widened([blocks[i]], wide):
            h = fam.call_layer(blocks[i], h, inputs)
        if i + 1 in want:
            out[i + 1] = h.to(storage_dtype)
    return out if on_device else {k: v.cpu() for k, v in out.items()}


def _ids_to(ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The token ids on the teacher's device. A GPU gets them from pinned memory without a wait: a copy from
    pageable memory first waits for everything queued on the stream (CUDA's rule for pageable copies), so the next
    batch's forward could not be queued while this one runs (zgdata/core/host_copy.py's ``one_ahead``)."""
    if device.type == "cuda" and ids.device.type == "cpu":
        return ids.pin_memory().to(device, non_blocking=True)
    return ids.to(device)


def capture_rows(
    model,
    input_ids: torch.Tensor,
    layers: list[int],
    *,
    storage_dtype: torch.dtype,
    rows: int,
    on_device: bool = False,
) -> dict[int, torch.Tensor]:
    """``capture`` in forwards of exactly ``rows`` sequences (``materialize.batch_size``), a short last one padded
    with copies of its last sequence, whose outputs are dropped.

    A GPU's GEMM and attention kernels are chosen per shape, so a row's bits can depend on how many rows its forward
    held. Materialize (one process or shards), online targets and verify all capture through here, so a row gets
    the same bits whichever of them computes it and wherever its batch ends. On the CPU the bits are the same
    either way (tests/zgdata/materialize/test_capture_rows.py). ``on_device`` as in ``capture``."""
    if rows < 1 or not len(input_ids):
        raise ValueError(f"capture_rows needs rows >= 1 and at least one sequence, got rows={rows}, {len(input_ids)}")
    parts = []
    for i in range(0, len(input_ids), rows):
        chunk = input_ids[i : i + rows]
        n = len(chunk)
        if n < rows:
            chunk = torch.cat([chunk, chunk[-1:].expand(rows - n, -1)])
        caps = capture(model, chunk, layers, storage_dtype=storage_dtype, on_device=on_device)
        parts.append({k: v[:n] for k, v in caps.items()})
    if len(parts) == 1:
        return parts[0]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

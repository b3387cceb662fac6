"""Compute wider than the teacher is stored, one module at a time.

A bf16 teacher computed in fp32 (``materialize.compute_dtype: float32``) would otherwise be loaded
as a whole fp32 copy: twice its stored size, the one copy a teacher too big for fp32 memory cannot
afford. Loaded for capture (``load_teacher(..., per_layer=True)``), it stays in its stored dtype and
carries its compute dtype in ``COMPUTE_ATTR``; zgdata.families.capture widens the embedding modules, then each
decoder layer, only while it runs, and puts the stored tensors back. bf16 -> fp32 is exact, so every
op sees the very fp32 values a whole fp32 load would give: the boundaries are bit-identical (tested
per family in tests/zgdata/teacher/test_teacher_sources.py), and no CAPTURE_VERSION bump is needed.

``running_widened`` does the same for a whole-model forward (evaluate, lm-eval): forward hooks widen each
top-level piece (embeddings, each decoder layer, final norm, head) only while that piece runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch

__all__ = ["COMPUTE_ATTR", "compute_dtype", "widened", "running_widened"]

COMPUTE_ATTR = "zg_compute_dtype"


def compute_dtype(model) -> torch.dtype | None:
    """The dtype capture widens to, or None when the model computes in the dtype it is loaded in."""
    return getattr(model, COMPUTE_ATTR, None)


@contextmanager
def widened(modules: Iterable[torch.nn.Module], dtype: torch.dtype | None) -> Iterator[None]:
    """Within the block, every floating parameter and buffer of ``modules`` narrower than ``dtype`` holds a
    ``dtype`` copy; on exit each gets its own stored tensor back (no rounding back, no second cast)."""
    if dtype is None:
        yield
        return
    saved = []
    try:
        for m in modules:
            for t in itertools.chain(m.parameters(), m.buffers()):
                if t.is_floating_point() and t.dtype.itemsize < dtype.itemsize:  # a tied tensor: once
                    saved.append((t, t.data))
                    t.data = t.data.to(dtype)
        yield
    finally:
        for t, data in reversed(saved):
            t.data = data


@contextmanager
def running_widened(model) -> Iterator[None]:
    """Within the block, calling ``model`` (a causal LM loaded per_layer, whole forward) widens each top-level piece
    only while it runs: the inner model's other children (embeddings, rotary, final norm), each decoder layer, then
    the output head. At most one layer's wide copy exists at a time, and the logits are those of a whole
    ``compute_dtype`` load, bit for bit. A model without a compute dtype runs as it is."""
    dtype = compute_dtype(model)
    if dtype is None:
        yield
        return
    from zgdata.families.registry import family_of

    fam = family_of(model.config)
    inner, blocks = fam.inner(model), fam.layers(model)
    pieces = [m for m in inner.children() if m is not blocks] + list(blocks) + [model.get_output_embeddings()]
    running: dict[int, ExitStack] = {}

    def before(module, args):
        stack = ExitStack()
        stack.enter_context(widened([module], dtype))
        running[id(module)] = stack

    def after(module, args, output):
        running.pop(id(module)).close()

    handles = []
    try:
        for m in {id(m): m for m in pieces}.values():
            handles += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
        yield
    finally:
        for h in handles:
            h.remove()
        for stack in running.values():  # a forward that raised mid-piece
            stack.close()
        running.clear()

"""Compute wider than the teacher is stored, one module at a time.

A bf16 teacher computed in fp32 (``materialize.compute_dtype: float32``) would otherwise be loaded
as a whole fp32 copy: twice its stored size, the one copy a teacher too big for fp32 memory cannot
afford. Loaded for capture (``load_teacher(..., per_layer=True)``), it stays in its stored dtype and
carries its compute dtype in ``COMPUTE_ATTR``; zgdata.capture widens the embedding modules, then each
decoder layer, only while it runs, and puts the stored tensors back. bf16 -> fp32 is exact, so every
op sees the very fp32 values a whole fp32 load would give: the boundaries are bit-identical (tested
per family in tests/zgdata/test_teacher_sources.py), and no CAPTURE_VERSION bump is needed.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch

__all__ = ["COMPUTE_ATTR", "compute_dtype", "widened"]

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

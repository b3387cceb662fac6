"""Seeds and learning rates that every trainer derives the same way.

``block_seed`` turns (params seed, a section's seed offset, a name) into a stable seed; ``lr_at`` is the
learning rate of a step: linear warmup, then cosine to 10%, linear to 0 or constant. Block training and
repair read the shape from their config's ``schedule``; local pretraining is cosine only (its config's
``schedule`` field names the block schedule, zgtrain/local/schedule.py, not this).
"""

from __future__ import annotations

import math

from zgdata.core.hashing import sha256_bytes

__all__ = ["block_seed", "lr_at", "SHAPES"]

SHAPES = ("cosine", "linear", "constant")


def block_seed(global_seed: int, offset: int, key: str) -> int:
    """A stable per-block seed: independent of process, Python hash seed and block order."""
    return int(sha256_bytes(f"{global_seed}/{offset}/{key}".encode())[:15], 16)


def lr_at(cfg, step: int, shape: str | None = None) -> float:
    """The learning rate of ``step`` for a config with ``lr``, ``warmup`` and ``steps`` (``shape``: default
    ``cfg.schedule``)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    length = max(cfg.steps - cfg.warmup, 1)
    p = min((step - cfg.warmup) / length, 1.0)
    shape = shape or cfg.schedule
    if shape == "cosine":
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    if shape == "linear":
        return cfg.lr * (1 - p)
    return cfg.lr

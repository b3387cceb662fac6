"""Typed views of the params.yaml sections that zgtrain owns: train, blocks, eval, gates."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from zgdata.config import section
from zgdata.errors import ZgError

__all__ = ["TrainConfig", "EvalConfig", "GatesConfig", "block_config", "CONVERSIONS", "OBJECTIVES"]

CONVERSIONS = ("identity", "prune_mlp", "drop_layers", "reinit")
OBJECTIVES = ("regress", "noisy_regress", "denoise")


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    conversion: str = "prune_mlp"
    """How the student block starts: identity, prune_mlp, drop_layers or reinit."""
    prune_ratio: float = 0.5
    """prune_mlp: fraction of MLP channels removed (by activation importance on the block's input data)."""
    keep_layers: list = field(default_factory=list)
    """drop_layers: which of the block's layers to keep, as offsets within the block (e.g. [0, 2, 4])."""
    importance_rows: int = 16
    """prune_mlp: train sequences used to score channel importance."""
    objective: str = "regress"
    """regress (clean MSE to the target boundary), noisy_regress (input + sigma*noise -> target), denoise (input + sigma*noise -> input, unanchored)."""
    normalize: str = "target"
    """Loss normalization per dimension: none, target (divide by the target's per-dim variance) or delta (regress the block's residual update, normalized by its variance)."""
    noise_sigma: float = 0.1
    """noisy_regress/denoise: noise std, relative to the input's per-dimension std."""
    targets: str = "cached"
    """cached (read the stored boundaries) or online (recompute them with the teacher each batch)."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 4
    """Whole sequences per step."""
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup: int = 10
    """Linear warmup steps."""
    schedule: str = "cosine"
    """LR schedule after warmup: cosine (to 10%), linear (to 0) or constant."""
    grad_clip: float = 1.0
    """Max gradient norm (0 disables)."""
    seed: int = 0
    """Block seed offset; the block's seed is a stable hash of (params seed, this, block key)."""
    checkpoint_every: int = 50
    """Steps between checkpoints (0: only at the end)."""
    heldout_rows: int = 0
    """Held-out sequences for heldout_loss (0: all)."""

    def __post_init__(self):
        if self.conversion not in CONVERSIONS:
            raise ZgError(f"train.conversion is '{self.conversion}'", key="train.conversion",
                          fix=f"use one of {', '.join(CONVERSIONS)}")
        if self.objective not in OBJECTIVES:
            raise ZgError(f"train.objective is '{self.objective}'", key="train.objective",
                          fix=f"use one of {', '.join(OBJECTIVES)}")
        checks = [("normalize", self.normalize in ("none", "target", "delta"), "none, target or delta"),
                  ("targets", self.targets in ("cached", "online"), "cached or online"),
                  ("schedule", self.schedule in ("cosine", "linear", "constant"), "cosine, linear or constant"),
                  ("prune_ratio", 0 <= self.prune_ratio < 1, "a fraction in [0, 1)"),
                  ("steps", self.steps >= 0, "a count >= 0"), ("batch_size", self.batch_size >= 1, "a count >= 1"),
                  ("lr", 0 < self.lr < float("inf"), "a positive, finite number"), ("noise_sigma", self.noise_sigma >= 0, ">= 0"),
                  ("beta1", 0 <= self.beta1 < 1, "a value in [0, 1)"), ("beta2", 0 <= self.beta2 < 1, "a value in [0, 1)"),
                  ("checkpoint_every", self.checkpoint_every >= 0, "a count >= 0"),
                  ("warmup", self.warmup >= 0, "a count >= 0")]
        for key, ok, want in checks:
            if not ok:
                raise ZgError(f"train.{key} is {getattr(self, key)!r}", key=f"train.{key}", fix=f"use {want}")


@dataclass(kw_only=True, frozen=True)
class EvalConfig:
    window: int = 32
    """Context use: tokens each fresh window keeps before its target."""
    context_targets: int = 512
    """Context use: how many held-out target positions are scored."""
    context_min_pos: int = 256
    """Context use: targets are drawn from positions >= this."""
    heldout_seqs: int = 0
    """Held-out sequences for CE (0: all)."""
    batch_size: int = 8
    """Sequences per forward pass."""
    seed: int = 0
    """Seed of the target sample."""

    def __post_init__(self):
        if self.window < 1 or self.context_min_pos < self.window:
            raise ZgError(f"eval.window={self.window} and eval.context_min_pos={self.context_min_pos}",
                          key="eval.window", fix="need 1 <= window <= context_min_pos")


@dataclass(kw_only=True, frozen=True)
class GatesConfig:
    max_ce_gap: float = 0.5
    """Fail if student CE exceeds teacher CE by more than this many nats/token."""
    min_context_retention: float = 0.5
    """Fail if student context use / teacher context use is below this."""


def block_config(params: Mapping[str, Any], key: str) -> TrainConfig:
    """``train:`` defaults overridden by ``blocks.KEY`` (minus its in/out)."""
    base = section(params, TrainConfig, "train")
    body = (params.get("blocks") or {}).get(key)
    if body is None:
        raise ZgError(f"block '{key}' is not in params.yaml blocks:", key="blocks",
                      fix=f"use one of {', '.join(params.get('blocks') or {}) or '(none)'}")
    over = {k: v for k, v in body.items() if k not in ("in", "out")}
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(over) - known)
    if unknown:
        raise ZgError(f"unknown key(s) {', '.join(f'blocks.{key}.{u}' for u in unknown)}", key=f"blocks.{key}",
                      fix=f"per-block keys override train:, known: {', '.join(sorted(known))}")
    return replace(base, **over)

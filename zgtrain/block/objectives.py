"""Block objectives: what the block is fed and what it must produce. Pure tensor math.

- regress:        x           -> y      (clean teacher-boundary regression: the interface that composes)
- noisy_regress:  x + s*noise -> y
- denoise:        x + s*noise -> x      (unanchored: never sees y)

Losses are per-dimension normalized MSE; the scale is fixed once from a deterministic
sample so that massive-activation dimensions do not drown the rest.
"""

from __future__ import annotations

import torch

from zgtrain.project.names import OBJECTIVES, ObjectiveSpec  # the names and specs, torch-free for params validation

__all__ = ["Objective", "ObjectiveSpec", "OBJECTIVES", "nmse", "squared_error"]


class Objective:
    def __init__(
        self,
        name: str,
        *,
        normalize: str,
        sigma: float,
        x_sample: torch.Tensor,
        y_sample: torch.Tensor,
        device: torch.device | str = "cpu",
    ):
        self.name, self.spec, self.sigma = name, OBJECTIVES[name], sigma
        xs, ys = x_sample.double().flatten(0, 1), y_sample.double().flatten(0, 1)  # (N*T, C)
        self.x_std = xs.std(0).float().clamp_min(1e-6).to(device)  # (C,)
        target = ys if self.spec.anchored else xs
        if normalize == "none":
            scale = torch.ones(xs.shape[1], dtype=torch.float64)
        elif normalize == "target":
            scale = target.var(0)
        else:  # delta: the block's own residual update
            scale = (target - xs).var(0)
        self.scale = scale.float().clamp_min(1e-8).to(device)  # (C,)

    def batch(self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, target) for one batch; noise comes from the block's own generator."""
        if not self.spec.noisy:
            return x, (y if self.spec.anchored else x)
        # drawn on the CPU generator, then moved: the same bits on every device
        noise = torch.randn(x.shape, generator=gen).to(x.device) * self.x_std * self.sigma  # (B, T, C)
        return x + noise, (y if self.spec.anchored else x)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((pred - target).pow(2) / self.scale).mean()


def squared_error(pred: torch.Tensor, target: torch.Tensor) -> float:
    """The summed squared error, in float64: ``nmse``'s numerator."""
    return float((pred.double() - target.double()).pow(2).sum())


def nmse(pred: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """(sum of squared error, sum of squared deviation of target from its per-dim mean), for a ratio."""
    t = target.double()
    dev = (t - t.flatten(0, 1).mean(0)).pow(2).sum()
    return squared_error(pred, target), float(dev)

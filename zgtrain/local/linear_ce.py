"""Cross-entropy of a linear LM head, computed in token chunks without the full logits tensor.

``F.cross_entropy(z @ W.T, y)`` over a 49k vocabulary materializes (tokens x vocab) logits, their
fp32 copy, the log-softmax and its gradient: on CPU those passes over memory cost more than the
head's matmuls. ``linear_ce`` walks the tokens in chunks and, for each, computes the logits, their
log-sum-exp, the loss and, when a gradient is wanted, the gradients of ``z`` and ``W`` right away
(softmax - onehot), the way fused linear cross-entropy kernels do. The chunk order is fixed, so the
result is deterministic. Logits and the softmax are fp32; the matmuls run in ``dtype`` (fp32, or
bf16 under ``local.precision: bf16``).
"""

from __future__ import annotations

import torch

__all__ = ["linear_ce"]

CHUNK = 1024  # tokens per chunk: 1024 x 49,152 fp32 logits = 200 MB


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, w, target, dtype, chunk):
        n = z.shape[0]
        want_z, want_w = ctx.needs_input_grad[:2]
        wc = w.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # logits, softmax and sums: fp32 (fp64 for fp64)
        total = torch.zeros((), dtype=acc, device=z.device)
        gz = torch.empty_like(z) if want_z else None
        gw = torch.zeros(w.shape, dtype=acc, device=w.device) if want_w else None
        with torch.autocast(z.device.type, enabled=False):  # the dtypes are this function's own
            _chunks(z, wc, target, dtype, chunk, total, gz, gw)
        ctx.save_for_backward(gz, None if gw is None else gw.to(w.dtype))
        return total / n

    @staticmethod
    def backward(ctx, g):
        gz, gw = ctx.saved_tensors
        return (
            None if gz is None else gz * g.to(gz.dtype),
            None if gw is None else gw * g.to(gw.dtype),
            None,
            None,
            None,
        )


def _chunks(z, wc, target, dtype, chunk, total, gz, gw) -> None:
    """Accumulate the summed CE into ``total`` and the gradients of the mean into ``gz`` / ``gw`` (when given)."""
    n = z.shape[0]
    for i in range(0, n, chunk):
        zc, yc = z[i : i + chunk].to(dtype), target[i : i + chunk]
        logits = (zc @ wc.T).to(total.dtype)
        lse = torch.logsumexp(logits, dim=-1)
        total += (lse - logits.gather(1, yc[:, None]).squeeze(1)).sum()
        if gz is not None or gw is not None:
            p = logits.sub_(lse[:, None]).exp_()  # softmax, in place
            p[torch.arange(len(yc), device=p.device), yc] -= 1.0
            p = p.div_(n).to(dtype)
            if gz is not None:
                gz[i : i + chunk] = (p @ wc).to(z.dtype)
            if gw is not None:
                gw += (p.T @ zc).to(gw.dtype)


def linear_ce(
    z: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Mean CE of ``target`` (N,) under logits ``z @ weight.T``, z (N, H), weight (V, H); differentiable in both."""
    if z.dim() != 2 or target.shape != z.shape[:1]:
        raise ValueError(f"linear_ce wants z (N, H) and target (N,), got {tuple(z.shape)} and {tuple(target.shape)}")
    return _LinearCE.apply(z, weight, target, dtype, chunk)

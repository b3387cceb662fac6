"""zgtrain/local/linear_ce.py: the chunked linear + cross-entropy that the local heads train through.

Against ``F.cross_entropy(z @ W.T, y)`` in float64 (two formulations of one function: compared
with allclose at float64 rounding), torch's own gradcheck, and the no-grad path used in evaluation.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from zgtrain.local.linear_ce import linear_ce


def _inputs(n=300, h=16, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, h, generator=g, dtype=torch.float64, requires_grad=True)
    return z, w, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("chunk", [1, 64, 299, 300, 1024])
def test_loss_and_gradients_match_cross_entropy_at_any_chunk(chunk):
    z, w, y = _inputs()
    loss = linear_ce(z, w, y, dtype=torch.float64, chunk=chunk)
    gz, gw = torch.autograd.grad(2.5 * loss, (z, w))
    ref = F.cross_entropy(z @ w.T, y)
    rz, rw = torch.autograd.grad(2.5 * ref, (z, w))
    assert torch.allclose(loss, ref, rtol=0, atol=1e-12)
    assert torch.allclose(gz, rz, rtol=0, atol=1e-12) and torch.allclose(gw, rw, rtol=0, atol=1e-12)


def test_gradcheck_and_only_the_wanted_gradients():
    z, w, y = _inputs(n=40, h=6, v=11)
    assert torch.autograd.gradcheck(lambda a, b: linear_ce(a, b, y, dtype=torch.float64, chunk=16), (z, w))
    frozen = w.detach()
    (gz,) = torch.autograd.grad(linear_ce(z, frozen, y, dtype=torch.float64), (z,))
    assert torch.allclose(gz, torch.autograd.grad(F.cross_entropy(z @ frozen.T, y), (z,))[0], rtol=0, atol=1e-12)


def test_no_grad_gives_the_same_loss_and_chunks_are_deterministic():
    z, w, y = _inputs(n=500, h=32, v=97)
    z32, w32 = z.detach().float(), w.detach().float()
    with torch.no_grad():
        a = linear_ce(z32, w32, y, chunk=128)
    b = linear_ce(z32.requires_grad_(), w32.requires_grad_(), y, chunk=128)
    assert torch.equal(a, b.detach())
    assert torch.equal(linear_ce(z32, w32, y, dtype=torch.bfloat16), linear_ce(z32, w32, y, dtype=torch.bfloat16))


def test_shapes_are_checked():
    z, w, y = _inputs()
    with pytest.raises(ValueError, match="wants z"):
        linear_ce(z[None], w, y)


def test_bf16_matmuls_still_accumulate_the_loss_in_float32():
    """Under ``dtype=bfloat16`` only the matmuls run in bf16: the log-sum-exp and the sum over 2048 tokens are
    fp32, so the loss is a float32 tensor within float32-sum accuracy of the exact CE of the same (bf16) inputs.
    Each bf16 logit is rounded by at most 2^-9 relative and those errors average out over tokens (~1e-5 relative
    here); sums kept in bf16 (8 significant bits, a step of 2^-8 ~ 4e-3 relative near 29) miss by ~3e-3."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2048, 64, generator=g).bfloat16()
    w = torch.randn(4000, 64, generator=g).bfloat16()
    y = torch.randint(0, 4000, (2048,), generator=g)
    loss = linear_ce(z, w, y, dtype=torch.bfloat16, chunk=512)
    ref = F.cross_entropy(z.double() @ w.double().T, y)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 3e-4 * ref.item(), (loss.item(), ref.item())

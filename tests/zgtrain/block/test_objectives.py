"""zgtrain.block.objectives: what each objective feeds and targets, where its noise comes from, its scales and nmse, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from zgtrain.block.objectives import Objective, nmse

# One sequence of 3 tokens, 2 dims. Per-dim (unbiased) variances, by hand:
#   x:     dim0 1,3,5 -> 4     dim1 2,6,10 -> 16      (std 2, 4)
#   y:     dim0 2,4,6 -> 4     dim1 2,8,14 -> 36
#   y - x: dim0 1,1,1 -> 0     dim1 0,2,4  -> 4
X = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]]])
Y = torch.tensor([[[2.0, 2.0], [4.0, 8.0], [6.0, 14.0]]])


def _obj(name="regress", normalize="none", sigma=0.5):
    return Objective(name, normalize=normalize, sigma=sigma, x_sample=X, y_sample=Y)


@pytest.mark.parametrize(
    "name,normalize,scale",
    [
        ("regress", "none", [1.0, 1.0]),
        ("regress", "target", [4.0, 36.0]),
        ("regress", "delta", [1e-8, 4.0]),  # a dim the block never changes: clamped, not 0
        ("noisy_regress", "target", [4.0, 36.0]),
        ("denoise", "target", [4.0, 16.0]),  # denoise's target is x itself
        ("denoise", "delta", [1e-8, 1e-8]),  # x - x
    ],
)
def test_normalization_scales_by_hand(name, normalize, scale):
    o = _obj(name, normalize)
    assert o.scale.dtype == torch.float32 and o.scale.shape == (2,)
    assert torch.allclose(o.scale, torch.tensor(scale), rtol=1e-6, atol=0), o.scale
    assert torch.allclose(o.x_std, torch.tensor([2.0, 4.0]), rtol=1e-6, atol=0)


def test_loss_is_per_dim_normalized_mse_by_hand():
    o = _obj("regress", "target")  # scale (4, 36)
    pred = torch.tensor([[[0.0, 0.0], [1.0, 6.0]]])
    tgt = torch.tensor([[[2.0, 6.0], [1.0, 0.0]]])
    # squared errors / scale: 4/4, 36/36, 0/4, 36/36 -> mean of (1, 1, 0, 1)
    assert torch.allclose(o.loss(pred, tgt), torch.tensor(0.75), rtol=1e-6, atol=0)


def test_regress_passes_its_inputs_through_and_draws_no_noise():
    o = _obj("regress", "target")
    x, y = torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    gen = torch.Generator().manual_seed(5)
    before = gen.get_state()
    inp, tgt = o.batch(x, y, gen)
    assert inp is x and tgt is y
    assert torch.equal(gen.get_state(), before)


@pytest.mark.parametrize("name", ["noisy_regress", "denoise"])
def test_noise_comes_only_from_the_generator(name):
    o = _obj(name, "target", sigma=0.5)
    x, y = torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    torch.manual_seed(1)  # the global RNG must not matter
    a_in, a_tgt = o.batch(x, y, torch.Generator().manual_seed(11))
    torch.manual_seed(2)
    torch.randn(100)
    b_in, b_tgt = o.batch(x, y, torch.Generator().manual_seed(11))
    assert torch.equal(a_in, b_in) and torch.equal(a_tgt, b_tgt)
    assert a_tgt is (y if name == "noisy_regress" else x)
    # the noise is exactly the generator's normal draws times per-dim std(x) times sigma
    draws = torch.randn(x.shape, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a_in, x + draws * torch.tensor([2.0, 4.0]) * 0.5)
    # another generator state, other noise; the batch consumed exactly one draw of x's shape
    c_in, _ = o.batch(x, y, torch.Generator().manual_seed(12))
    assert not torch.equal(c_in, a_in)
    g, ref = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    o.batch(x, y, g)
    torch.randn(x.shape, generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())


def test_zero_sigma_adds_nothing():
    x, y = torch.randn(1, 3, 2), torch.randn(1, 3, 2)
    inp, tgt = _obj("denoise", "none", sigma=0.0).batch(x, y, torch.Generator().manual_seed(0))
    assert torch.equal(inp, x) and tgt is x


def test_nmse_by_hand():
    target = torch.tensor([[[1.0, 0.0], [3.0, 4.0]], [[5.0, 8.0], [7.0, 0.0]]])  # (B=2, T=2, C=2)
    pred = target + torch.tensor([[[1.0, 0.0], [0.0, -2.0]], [[0.0, 0.0], [3.0, 0.0]]])
    err, dev = nmse(pred, target)
    # err: 1 + 4 + 9 = 14
    # per-dim means over the 4 positions: dim0 (1+3+5+7)/4 = 4, dim1 (0+4+8+0)/4 = 3
    # dev: dim0 9+1+1+9 = 20, dim1 9+1+25+9 = 44 -> 64
    assert isinstance(err, float) and isinstance(dev, float)
    assert (err, dev) == (14.0, 64.0)
    assert nmse(target, target) == (0.0, 64.0)
    assert math.isclose(err / dev, 14 / 64)

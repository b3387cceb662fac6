"""The sample stage's top-p filter (zgdata/tokens/nucleus.py) gives transformers' ``TopPLogitsWarper``'s output bit
for bit (the float bits compared as integers): on random logits at several top-p, on rows whose cut falls inside a
run of equal values (where only the warper's sort order decides which of them go), with -inf tails, NaN, signed
zeros, and in dtypes it hands to the warper. The sample stage's ``generate`` draws the same tokens with it as
``generate`` with transformers' own temperature and top-p."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import TopPLogitsWarper

from tests.helpers.models import tiny_family_teacher
from zgdata.config import SampleConfig
from zgdata.tokens.nucleus import NucleusFilter
from zgdata.tokens.sample import _generate

INT = {4: torch.int32, 2: torch.int16, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT[t.element_size()])


def _same(top_p: float, x: torch.Tensor) -> torch.Tensor:
    """The warper's output for ``x``, after checking that the filter's is the same bits."""
    ids = torch.zeros(x.shape[0], 1, dtype=torch.long)
    want = TopPLogitsWarper(top_p)(ids, x.clone())
    got = NucleusFilter(top_p)(ids, x.clone())
    assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want))
    return want


@pytest.mark.parametrize("top_p", [0.01, 0.5, 0.9, 0.95, 0.999])
def test_random_logits_are_filtered_as_transformers_filters_them(top_p):
    g = torch.Generator().manual_seed(round(top_p * 1000))
    for scale in (0.5, 3.0, 20.0):
        want = _same(top_p, torch.randn(16, 4096, generator=g) * scale)
        removed = want.isinf().sum(dim=-1)
        assert (removed > 0).all() and (removed < 4096).all()  # every row cut somewhere inside


def test_a_cut_inside_equal_values_follows_the_warpers_order():
    x = torch.zeros(4, 1000)  # row 0: every logit equal, so the cut falls inside one run of ties
    x[1, :10] = 5.0
    x[2] = torch.randn(1000, generator=torch.Generator().manual_seed(0)).round()  # integer logits: runs of ties
    x[3, ::2] = -0.0  # zeros of both signs, equal as values
    want = _same(0.9, x)
    # which of row 0's equal tokens go is the sort's choice: neither all of them (every token at or below the last
    # removed value) nor none
    assert 0 < want[0].isinf().sum() < 1000


def test_infinities_nan_and_other_dtypes_match_the_warper():
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(1))
    x[0, :500] = -float("inf")  # a masked vocabulary
    x[1] = -float("inf")
    x[1, 7] = 0.0  # one finite token
    x[2, 3] = float("nan")
    x[3] = -float("inf")  # nothing finite: the warper's softmax is NaN and it removes nothing
    x[4, 100:] = x[4, 99]  # the row's largest values tied
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        _same(0.95, x.to(dtype))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sample_stage_draws_what_transformers_top_p_draws(temperature):
    model = tiny_family_teacher("llama")
    scfg = SampleConfig(tokens=40, temperature=temperature, top_p=0.9, threads=1)
    prompts = [[1], [1, 72, 101], [1, 84], [1, 65, 66, 67, 68]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    gen = GenerationConfig(
        do_sample=True, temperature=temperature, top_p=0.9, top_k=0, max_new_tokens=40, eos_token_id=2, pad_token_id=0
    )
    for seed in (0, 1, 2):
        model.generation_config = GenerationConfig()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)[:, width:].tolist()
        want = [r[: r.index(2)] if 2 in r else r for r in out]
        assert _generate(model, prompts, scfg, seed, eos=2, pad=0) == want
        assert sum(map(len, want)) > 40  # the draws ran for many tokens

"""zgtrain.evaluate.metrics on models built in the test: hand-computed NLLs, window/full-context agreement, seeded targets;
and the generation check's matching prefix (zgtrain/evaluate/generation.py) on rows made by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from zgtrain.evaluate.generation import matching_prefix
from zgtrain.evaluate.metrics import context_targets, token_nll, window_nll

V = 4  # vocabulary of the bigram model


class Bigram(torch.nn.Module):
    """Logits depend only on the current token: log 3 for its successor (mod V), 0 elsewhere.

    So p(next = cur + 1) = 3 / (3 + V - 1) = 1/2 and every other token has 1/6: the NLL of each
    position is log 2 or log 6, known by hand.
    """

    def __init__(self):
        super().__init__()
        table = torch.zeros(V, V)
        table[torch.arange(V), (torch.arange(V) + 1) % V] = math.log(3)
        self.register_buffer("table", table)

    @property
    def device(self):
        return self.table.device

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, T, V)


def _hand_nll(ids: torch.Tensor) -> torch.Tensor:
    """(N, T-1): log 2 where the next token is the successor of the current one, else log 6."""
    hit = ids[:, 1:] == (ids[:, :-1] + 1) % V
    f64 = dict(dtype=torch.float64)
    return torch.where(hit, torch.tensor(math.log(2), **f64), torch.tensor(math.log(6), **f64))


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _ids(n: int, t: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def test_token_nll_by_hand_on_the_bigram_model():
    ids = torch.tensor([[0, 1, 2, 0, 0, 3, 0], [2, 3, 0, 1, 1, 2, 2]])
    got = token_nll(Bigram(), ids, batch_size=1)
    assert got.shape == (2, 6) and got.dtype == torch.float64
    l2, l6 = math.log(2), math.log(6)
    want = torch.tensor(
        [
            [l2, l2, l6, l6, l6, l2],  # 0>1 1>2 hit, 2>0 0>0 0>3 miss, 3>0 hit
            [l2, l2, l2, l6, l2, l6],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(got, want, rtol=0, atol=1e-6), (got, want)
    assert torch.equal(_hand_nll(ids), want)  # the helper the window test relies on agrees with the table


def test_window_nll_by_hand_on_the_bigram_model():
    ids = torch.stack([torch.arange(20) % V, torch.arange(20) * 2 % V, torch.tensor([0, 1] * 10)])
    targets = torch.tensor([[0, 5], [1, 19], [2, 7], [2, 12]])
    l2, l6 = math.log(2), math.log(6)
    # token before -> target: row 0 4>5 is 0>1 (hit); row 1 18>19 is 0>2 (miss); row 2 6>7 is 0>1, 11>12 is 1>0
    want = torch.tensor([l2, l6, l2, l6], dtype=torch.float64)
    assert torch.equal(_hand_nll(ids)[targets[:, 0], targets[:, 1] - 1], want)
    for window in (1, 3, 5):  # a bigram model needs only the last token: every window gives the same NLL
        got = window_nll(Bigram(), ids, targets, window=window, batch_size=3)
        assert got.shape == (4,) and got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=0, atol=1e-6), window


def test_token_nll_matches_the_model_logits_and_ignores_batch_size(llama):
    ids = _ids(5, 12, llama.config.vocab_size)
    got = token_nll(llama, ids, batch_size=2)
    assert got.shape == (5, 11) and got.dtype == torch.float64
    with torch.no_grad():
        logp = torch.log_softmax(llama(input_ids=ids).logits.double(), -1)  # (N, T, V)
    want = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(token_nll(llama, ids, batch_size=5), got, rtol=1e-5, atol=1e-6)
    assert torch.equal(token_nll(llama, ids, batch_size=2), got)  # deterministic on repeat


def test_window_over_the_whole_prefix_equals_full_context_nll(llama):
    ids = _ids(4, 16, llama.config.vocab_size, seed=2)
    window = 9  # target position 9 seen through tokens 0..8: exactly its full-context prefix
    targets = torch.stack([torch.arange(4), torch.full((4,), window)], 1)
    got = window_nll(llama, ids, targets, window=window, batch_size=3)
    full = token_nll(llama, ids, batch_size=4)[:, window - 1]
    assert got.shape == (4,)
    assert torch.allclose(got, full, rtol=1e-5, atol=1e-5)
    # a shorter window drops real context, so the figure changes (this is what the metric measures)
    assert not torch.allclose(
        window_nll(llama, ids, targets + torch.tensor([0, 4]), window=window, batch_size=3),
        token_nll(llama, ids, batch_size=4)[:, window + 3],
        rtol=1e-5,
        atol=1e-5,
    )


def test_context_targets_shape_range_order_and_seed():
    t = context_targets(5, 40, k=30, min_pos=25, seed=7)
    assert t.shape == (30, 2) and t.dtype == torch.int64
    assert bool((t[:, 0] >= 0).all() and (t[:, 0] < 5).all())
    assert bool((t[:, 1] >= 25).all() and (t[:, 1] < 40).all())
    assert len({tuple(r) for r in t.tolist()}) == 30  # no pair drawn twice
    assert t.tolist() == sorted(t.tolist())  # sorted by (sequence, position)
    assert torch.equal(context_targets(5, 40, k=30, min_pos=25, seed=7), t)
    assert not torch.equal(context_targets(5, 40, k=30, min_pos=25, seed=8), t)


def test_context_targets_small_cases_by_hand():
    # fewer candidates than k: every (sequence, position >= min_pos) pair, in order
    every = context_targets(2, 6, k=100, min_pos=4, seed=0)
    assert every.tolist() == [[0, 4], [0, 5], [1, 4], [1, 5]]
    # only the last position allowed
    last = context_targets(3, 8, k=2, min_pos=7, seed=3)
    assert last[:, 1].tolist() == [7, 7] and len(set(last[:, 0].tolist())) == 2


def test_a_set_without_context_targets_is_refused_with_its_key_before_scoring():
    """A set whose rows are not longer than eval.context_min_pos, or whose padded rows all end before it, has no
    context-use target: one error naming the set and the key (it was a traceback from torch after the models had
    been scored)."""
    from zgdata.errors import ZgError
    from zgtrain.evaluate.set_metrics import targets_for
    from zgtrain.evaluate.sets import EvalSet

    cfg = SimpleNamespace(context_targets=8, context_min_pos=48, seed=0)
    ids = torch.arange(2 * 64).reshape(2, 64)
    assert len(targets_for(EvalSet(name="long", ids=ids, lengths=None, lineage={}), cfg)) == 8
    short = EvalSet(name="short", ids=ids[:, :32], lengths=None, lineage={})
    with pytest.raises(ZgError, match="eval set short has rows of 32 tokens") as e:
        targets_for(short, cfg)
    assert e.value.key == "eval.context_min_pos"
    padded = EvalSet(name="padded", ids=ids, lengths=torch.tensor([40, 30]), lineage={})
    with pytest.raises(ZgError, match="eval set padded has no row longer than eval.context_min_pos 48") as e:
        targets_for(padded, cfg)
    assert e.value.key == "eval.context_min_pos"


def test_matching_prefix_counts_the_leading_run_of_agreeing_tokens_only():
    """Per row, the tokens the two continuations share before their first difference: agreement after it (a
    differing first token, one differing token inside) adds nothing."""
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [1, 1, 1, 1], [3, 3, 3, 3]])
    b = torch.tensor([[9, 2, 3, 4], [5, 6, 0, 8], [1, 1, 1, 1], [3, 3, 3, 0]])
    assert matching_prefix(a, b) == [0, 2, 4, 3]
    assert matching_prefix(b, a) == [0, 2, 4, 3]

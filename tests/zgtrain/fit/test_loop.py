"""The shared training loop (zgtrain/fit/): step order, checkpoint cadence, resume identity, typed results.

The trainers' own tests (block, repair, local) prove the bits; these pin what every trainer relies on,
with a real torch model and optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

from zgdata.errors import ZgError
from zgtrain.fit import loop
from zgtrain.fit.identity import resumable
from zgtrain.fit.schedule import lr_at


@dataclass
class _Cfg:
    lr: float = 1e-2
    warmup: int = 2
    steps: int = 10
    schedule: str = "cosine"


def _trainer(every: int):
    """(state, Steps, events, model): a real model and AdamW on seeded batches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    state, events, cfg = loop.RunState(), [], _Cfg()
    x = torch.randn(10, 3, 4)

    def work(step, batch):
        events.append(("work", step, opt.param_groups[0]["lr"]))
        loss = model(batch).pow(2).mean()
        loop.update(loss, model.parameters(), opt, 0.0, lambda what: ZgError(what))
        return batch.shape[0]

    steps = loop.Steps(
        name="test",
        batches=lambda a, b: ((s, x[s]) for s in range(a, b)),
        work=work,
        lrs=[(opt, lambda s: lr_at(cfg, s))],
        save=lambda s: events.append(("save", s)),
        checkpoint_every=every,
        on_step=lambda s: events.append(("step", s)),
        fail=lambda step, what: ZgError(f"step {step}: {what}"),
    )
    return state, steps, events, model


def _run(end: int, every: int):
    state, steps, events, model = _trainer(every)
    loop.fit(state, end, steps)
    return state, events, model


def test_steps_set_the_lr_then_work_then_checkpoint_on_cadence_except_at_the_end():
    state, events, _ = _run(6, every=3)
    assert state.step == 6 and state.tokens == 6 * 3
    assert [e for e in events if e[0] == "save"] == [("save", 3)]  # 6 is the end: the caller writes it
    assert [e[1] for e in events if e[0] == "work"] == list(range(6))
    assert [e[2] for e in events if e[0] == "work"] == [lr_at(_Cfg(), s) for s in range(6)]
    assert events.index(("save", 3)) < events.index(("step", 3)) < events.index(("work", 3, lr_at(_Cfg(), 3)))


@pytest.mark.parametrize("broken_at,saves", [(2, []), (5, [("save", 3)])])
def test_weights_an_optimizer_step_made_non_finite_are_never_saved(broken_at, saves):
    """A step whose update leaves a non-finite weight (its loss and gradient were finite) stops the run with the
    trainer's error before the next checkpoint (at 3) or the end (6): neither is written."""
    state, steps, events, model = _trainer(every=3)
    work = steps.work

    def breaking(step, batch):
        n = work(step, batch)
        if step == broken_at:
            with torch.no_grad():
                model.weight[0, 0] = float("inf")
        return n

    steps.work = breaking
    with pytest.raises(ZgError, match=f"step {broken_at}: the weights became non-finite"):
        loop.fit(state, 6, steps)
    assert [e for e in events if e[0] == "save"] == saves


def test_two_invocations_give_the_bits_of_one():
    _, _, whole = _run(8, every=0)
    state, steps, _, part = _trainer(every=0)
    loop.fit(state, 5, steps)
    assert state.step == 5
    loop.fit(state, 8, steps)  # the loop keeps nothing of its own between calls
    assert state.step == 8 and state.tokens == 8 * 3
    for k, v in whole.state_dict().items():
        assert torch.equal(part.state_dict()[k], v), k


def test_lr_shapes_and_stop_after():
    cfg = _Cfg()
    assert lr_at(cfg, 0) == cfg.lr / 2 and lr_at(cfg, 1) == cfg.lr
    assert lr_at(cfg, 9, "linear") == pytest.approx(cfg.lr * (1 - 7 / 8))
    assert lr_at(cfg, 5, "constant") == cfg.lr
    assert loop.end_step(10, 4, None) == 10 and loop.end_step(10, 4, 3) == 7 and loop.end_step(10, 9, 3) == 10
    with pytest.raises(ZgError) as e:
        loop.check_stop_after(0)
    assert e.value.key == "--stop-after"


def test_the_cosine_schedule_peaks_when_warmup_ends_and_decays_to_a_tenth_of_lr():
    """train.schedule's cosine (docs/reference/params.md): linear warmup, the peak lr at the first step after it
    (step == warmup), then lr * (0.1 + 0.9 * (1 + cos(pi * p)) / 2) over p = (step - warmup) / (steps - warmup),
    down to the floor 10% of lr at steps and after."""
    cfg = _Cfg()  # lr 1e-2, warmup 2, steps 10: 8 decay steps
    assert [lr_at(cfg, s) for s in range(cfg.warmup)] == [cfg.lr * (s + 1) / cfg.warmup for s in range(cfg.warmup)]
    assert lr_at(cfg, cfg.warmup) == cfg.lr  # the peak, not warmup's line continued past it
    for step in range(cfg.warmup, cfg.steps + 1):
        p = (step - cfg.warmup) / (cfg.steps - cfg.warmup)
        floor, rest = 0.1 * cfg.lr, 0.9 * cfg.lr
        assert lr_at(cfg, step) == pytest.approx(floor + rest * (1 + math.cos(math.pi * p)) / 2, rel=1e-12, abs=0)
    assert lr_at(cfg, 6) == pytest.approx(0.55 * cfg.lr, rel=1e-12, abs=0)  # halfway: halfway to the floor
    assert lr_at(cfg, cfg.steps) == lr_at(cfg, cfg.steps + 7) == cfg.lr * 0.1


def test_a_checkpoint_of_another_run_is_refused_naming_the_keys():
    identity = {"seed": 1, "config": {"lr": 0.001, "steps": 10}}
    prior = {"seed": 1, "config": {"lr": 0.002, "steps": 10}, "step": 3}
    assert resumable(None, identity, where="d", fix="f") is None
    assert resumable({**identity, "step": 3}, identity, where="d", fix="f")["step"] == 3
    with pytest.raises(ZgError, match=r"d holds a checkpoint of another run \(config.lr: 0.002 -> 0.001\)"):
        resumable(prior, identity, where="d", fix="rerun with --restart")
    assert resumable(prior, identity, where="d", fix="f", auto=True) is None  # zg repro starts afresh
    assert resumable({**identity, "done": True}, identity, where="d", fix="f", auto=True) is None


def test_reset_keeps_a_resumed_run_and_drops_partial_writes(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "meta.json").write_text("{}")
    (d / ".ckpt-000004.partial").mkdir()
    loop.reset(d, {"step": 3})
    assert sorted(p.name for p in d.iterdir()) == ["meta.json"]
    loop.reset(d, None)
    assert d.is_dir() and not any(d.iterdir())


@dataclass(kw_only=True)
class _Result(loop.Result):
    STOPPED: ClassVar[tuple] = ("status", "step")
    key: str
    status: str
    step: int
    extra: dict = field(default_factory=dict, metadata={"spread": True})
    last: float | None = None


def test_result_metrics_keep_the_field_order_and_spread_nested_keys():
    done = _Result(key="b00", status="done", step=4, extra={"kv_a": 1, "kv_b": 2}, last=0.5)
    assert list(done.metrics().items()) == [
        ("key", "b00"),
        ("status", "done"),
        ("step", 4),
        ("kv_a", 1),
        ("kv_b", 2),
        ("last", 0.5),
    ]
    assert _Result(key="b00", status="stopped", step=2).metrics() == {"status": "stopped", "step": 2}

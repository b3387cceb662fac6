"""The one training loop: block training, repair and local pretraining (both modes) all run their steps here.

What differs between trainers is passed in as a ``Steps``: the batches, the work of one step (forward, loss,
backward, optimizer steps: the only place parameters change), each optimizer's learning-rate schedule and
how a checkpoint is written. The loop owns what they share, in this order per step: set every learning rate,
do the step's work, count its tokens, advance the step, checkpoint every ``checkpoint_every`` steps (except
at ``end``: the caller writes the last one, finished or stopped), report the step, pause at the test
failpoint. Around the loop: ``--stop-after`` validation and the end step, the run folder's reset on a fresh
start (with what a killed run's atomic writes left), divergence errors and ``Result.metrics()``, the typed
result's JSON form.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from zgdata.core import failpoints
from zgdata.core.paths_guard import inside
from zgdata.core.progress import progress
from zgdata.core.timing import span
from zgdata.errors import ZgError

__all__ = [
    "Steps",
    "RunState",
    "Result",
    "fit",
    "check_stop_after",
    "end_step",
    "reset",
    "begin",
    "staged",
    "publish",
    "clear_partials",
    "diverged",
    "update",
    "optimizer_step",
    "mean_tail",
]


@dataclass(kw_only=True)
class RunState:
    """What the loop advances in every trainer's run: the next step, tokens trained on, seconds in steps."""

    step: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 and self.tokens else None


@dataclass(kw_only=True)
class Steps:
    """One trainer's part of the loop."""

    name: str  # the progress bar's label
    batches: Callable[[int, int], Iterable[tuple[int, Any]]]  # (start, end) -> (step, batch), in step order
    work: Callable[[int, Any], int]  # one step on its batch; returns the tokens it trained on
    lrs: Sequence[tuple[torch.optim.Optimizer, Callable[[int], float]]]  # each optimizer and its lr schedule
    save: Callable[[int], None]  # write the checkpoint of a step
    checkpoint_every: int
    fail: Callable[[int, str], ZgError]  # (step, what) -> the trainer's divergence error (``diverged``)
    on_step: Callable[[int], None] | None = None  # after each step (zg repro's progress); changes nothing


def fit(run: RunState, end: int, steps: Steps, *, timed: str | None = None) -> None:
    """Steps [run.step, end); ``timed`` names a timing span around them."""
    t0 = time.perf_counter()
    step = None
    with progress(steps.name, end - run.step, unit="step") as advance, span(timed) if timed else nullcontext():
        for step, batch in steps.batches(run.step, end):
            for opt, lr in steps.lrs:
                value = lr(step)
                for g in opt.param_groups:
                    g["lr"] = value
            run.tokens += steps.work(step, batch)
            advance(1)
            run.step = step + 1
            if steps.checkpoint_every and run.step % steps.checkpoint_every == 0 and run.step < end:
                _check_finite(steps, step)  # a checkpoint is never of broken weights: it is the one to go back to
                steps.save(run.step)
            if steps.on_step is not None:
                steps.on_step(run.step)
            failpoints.pause(failpoints.AFTER_STEP)  # a test's kill lands between steps
            failpoints.hold(failpoints.HOLD_AFTER_STEP)  # or the run waits there until the test lets it go
    if step is not None:  # what the trainer saves and publishes next (its last checkpoint, or a stop's)
        _check_finite(steps, step)
    run.seconds += time.perf_counter() - t0


def _check_finite(steps: Steps, step: int) -> None:
    """Refuse weights that an optimizer step made non-finite (the loss and gradient checks of ``update`` see only
    the next step's loss): at each checkpoint and at the end, so no checkpoint and no finished run holds them."""
    params = (p for opt, _ in steps.lrs for group in opt.param_groups for p in group["params"])
    if not all(bool(torch.isfinite(p).all()) for p in params):
        raise steps.fail(step, "the weights became non-finite after the optimizer step")


def check_stop_after(stop_after: int | None) -> None:
    if stop_after is not None and stop_after < 1:
        raise ZgError(f"--stop-after is {stop_after}", key="--stop-after", fix="give a number of steps >= 1")


def end_step(steps: int, start: int, stop_after: int | None) -> int:
    """Where this invocation stops: the run's last step, or ``stop_after`` steps on from ``start``."""
    return steps if stop_after is None else min(steps, start + stop_after)


def clear_partials(d: Path) -> None:
    """Remove what a killed run's atomic writes left in run folder ``d`` (zgdata/core/atomic.py's .NAME.partial)."""
    for dead in sorted(Path(d).glob(".*.partial")) if Path(d).is_dir() else []:
        shutil.rmtree(dead) if dead.is_dir() else dead.unlink()


def reset(d: Path, prior: dict | None) -> None:
    """Ready run folder ``d``: emptied for a fresh start (``prior`` None), cleared of partial writes to resume."""
    clear_partials(d)
    if prior is None:
        shutil.rmtree(d, ignore_errors=True)
    Path(d).mkdir(parents=True, exist_ok=True)


def _aside(d: Path, what: str) -> Path:
    return Path(d).parent / f".{Path(d).name}.{what}"


def staged(d: Path, read_meta: Callable[[Path], dict | None], same_run: Callable[[dict], bool]) -> dict | None:
    """The checkpoint to resume in ``d``'s staging folder: one an earlier attempt of this very run (``same_run``
    of its meta) left there, unfinished, when it started afresh beside what ``d`` holds (zg repro after a params
    edit) and was killed or failed before it published. None when there is none; ``begin(staged=True)`` then
    resumes in that folder instead of removing it."""
    meta = read_meta(_aside(inside(d, what="run folder"), "staging"))
    return meta if meta is not None and not meta.get("done") and same_run(meta) else None


def begin(d: Path, prior: dict | None, *, staged: bool = False) -> Path:
    """The folder a run writes into: ``d`` itself, or a staging folder beside it when a fresh start would
    replace what ``d`` holds (``--restart`` over a finished or stopped run). ``publish`` swaps it in only when
    the run got as far as its last checkpoint, so a refused, failed or killed restart leaves ``d`` as it was.
    A previous run's leftover staging folder is removed here, unless ``staged``: it holds the checkpoint this
    run resumes (``staged``, the function).

    ``d`` must resolve inside its project (zgdata/core/paths_guard.py): every trainer's run folder passes here
    before anything in it is removed or written.
    """
    d = inside(d, what="run folder")
    staging, old = _aside(d, "staging"), _aside(d, "old")
    if old.exists():  # killed between publish's two renames: the old folder is the one to keep
        shutil.rmtree(old) if d.exists() else old.rename(d)
    if staged:
        clear_partials(staging)
        return staging
    shutil.rmtree(staging, ignore_errors=True)
    if prior is None and d.is_dir() and any(d.iterdir()):
        staging.mkdir(parents=True)
        return staging
    reset(d, prior)
    return d


def publish(work: Path, d: Path) -> None:
    """Swap run folder ``work`` (from ``begin``) in as ``d``: two renames, then the old folder is removed."""
    work, d = Path(work), Path(d)
    if work == d:
        return
    if not d.exists():  # a staged run resumed after its old folder was removed
        work.rename(d)
        return
    old = _aside(d, "old")
    d.rename(old)
    work.rename(d)
    shutil.rmtree(old)


def diverged(who: str, step: int, what: str, *, key: str, fix: str, good: int | None = None) -> ZgError:
    """The one error of a run whose loss, gradient or optimizer step stopped being finite."""
    last = "the last good checkpoint" + ("" if good is None else f" (step {good})")
    return ZgError(f"{who}: {what} at step {step}; {last} is intact", key=key, fix=fix)


def optimizer_step(opt: torch.optim.Optimizer, fail: Callable[[str], ZgError]) -> None:
    try:
        opt.step()
    except (OverflowError, RuntimeError) as e:  # AdamW's step size overflows float32 at absurd lr
        if "overflow" not in str(e):
            raise
        raise fail(f"the optimizer step overflowed ({e})") from e


def update(
    loss: torch.Tensor, params, opt: torch.optim.Optimizer, grad_clip: float, fail: Callable[[str], ZgError]
) -> None:
    """Backward, clip (0: norm measured, nothing clipped), optimizer step; ``fail(what)`` on a non-finite value."""
    if not torch.isfinite(loss):
        raise fail(f"loss became {loss.item()}")
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or float("inf"))
    if not torch.isfinite(norm):
        raise fail(f"gradient norm became {norm.item()}")
    optimizer_step(opt, fail)
    opt.zero_grad(set_to_none=True)


def mean_tail(curve: list, n: int = 10) -> float | None:
    """The reported train loss: the mean of the last ``n`` losses (None before any step)."""
    import numpy as np

    return float(np.mean(curve[-n:])) if curve else None


@dataclass(kw_only=True)
class Result:
    """Base of the trainers' typed results. ``metrics()`` is the dict the metrics files and ``--json`` hold:
    every field in declaration order (a field with ``metadata={"spread": True}`` contributes its own keys),
    or only ``STOPPED``'s fields, in that order, for a run stopped by ``--stop-after``. Every subclass has a
    ``status`` field ("done" or "stopped")."""

    STOPPED: ClassVar[tuple[str, ...]] = ()

    def metrics(self) -> dict:
        if getattr(self, "status", None) == "stopped":
            return {k: getattr(self, k) for k in self.STOPPED}
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out.update(v) if f.metadata.get("spread") else out.__setitem__(f.name, v)
        return out

"""Train one block alone from its boundary pair, with its own seed, optimizer, RNG and checkpoints.

``setup`` builds a run (converted block, optimizer, objective, data source) and either starts
it or restores it from its checkpoint; ``fit`` runs optimizer steps; ``train_block`` is both
plus the final metrics. zgtrain/fit/checkpoint.py owns the files under models/blocks/KEY/.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from zgdata.atomic import write_json, write_text
from zgdata.errors import ZgError
from zgdata.hashing import sha256_bytes
from zgdata.layout import Layout
from zgdata.lineage import check
from zgdata.lock import locked
from zgdata.progress import progress
from zgdata.runtime import autocast, device, seed_all, set_threads
from zgdata.teacher.prepare import load_slice
from zgdata.timing import span
from zgtrain.fit import checkpoint
from zgtrain.project.config import ProjectConfig, TrainConfig
from zgtrain.block.conversions import convert
from zgtrain.block.kv_cache import kv_summary
from zgtrain.block.objectives import Objective, nmse
from zgtrain.block.targets import open_targets

__all__ = ["train_block", "setup", "fit", "Run", "block_seed", "lr_at", "TRAINER_VERSION"]

TRAINER_VERSION = 1
# Keys that do not change the trained bits, so a resume may change them.
_NOT_IDENTITY = ("targets", "checkpoint_every")


def block_seed(global_seed: int, offset: int, key: str) -> int:
    """A stable per-block seed: independent of process, Python hash seed and block order."""
    return int(sha256_bytes(f"{global_seed}/{offset}/{key}".encode())[:15], 16)


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    length = max(cfg.steps - cfg.warmup, 1)
    p = min((step - cfg.warmup) / length, 1.0)
    if cfg.schedule == "cosine":
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    if cfg.schedule == "linear":
        return cfg.lr * (1 - p)
    return cfg.lr


def _diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {str(a.get(k))[:40]} -> {str(b.get(k))[:40]}" for k in keys[:4])


def _heldout(block, targets, cfg: TrainConfig) -> float:
    rows = targets.rows("heldout")
    if cfg.heldout_rows:
        rows = rows[: cfg.heldout_rows]
    err = spread = 0.0
    where = next(block.parameters()).device
    with torch.no_grad():
        for i in range(0, len(rows), cfg.batch_size):
            x, y = targets.take(rows[i:i + cfg.batch_size])
            e, d = nmse(block(x.to(where).float()), y.to(where).float())
            err, spread = err + e, spread + d
    return err / max(spread, 1e-30)


def _diverged(key: str, d: Path, step: int, what: str) -> ZgError:
    good = checkpoint.read_meta(d)["step"]
    return ZgError(f"block {key}: {what} at step {step}; the last good checkpoint (step {good}) is intact",
                   key=f"blocks.{key}", fix="lower train.lr (or blocks.KEY.lr) and rerun with --restart")


@dataclass(kw_only=True)
class Run:
    """One block's training state: what ``setup`` builds and ``fit`` advances."""

    key: str
    cfg: TrainConfig
    dir: Path
    meta: dict
    block: torch.nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    objective: Objective
    src: object
    seed: int
    step: int = 0
    curve: list = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    on_step: object = None
    """Optional ``on_step(step, loss)`` after each optimizer step (zg repro's progress); never changes the run."""


def fit(run: Run, end: int) -> None:
    """Optimizer steps [run.step, end): the only place the block's parameters change."""
    cfg, block, opt, key, d = run.cfg, run.block, run.opt, run.key, run.dir
    sleep = float(os.environ.get("ZG_FAILPOINT_SLEEP_AFTER_STEP", "0"))  # test hook: widen kill window
    dev = next(block.parameters()).device
    block.train()
    t0 = time.perf_counter()
    with progress(f"train {key}", end - run.step, unit="step") as advance, span("train.steps"):
        for step, rows, x, y in run.src.batches("train", start_step=run.step, steps=end, batch_size=cfg.batch_size,
                                                seed=run.seed):
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, step)
            inp, tgt = run.objective.batch(x.to(dev).float(), y.to(dev).float(), run.gen)
            with autocast(dev, cfg.precision):
                loss = run.objective.loss(block(inp), tgt)
            if not torch.isfinite(loss):
                raise _diverged(key, d, step, f"loss became {loss.item()}")
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(block.parameters(), cfg.grad_clip or float("inf"))
            if not torch.isfinite(norm):
                raise _diverged(key, d, step, f"gradient norm became {norm.item()}")
            try:
                opt.step()
            except (OverflowError, RuntimeError) as e:  # AdamW's step size overflows float32 at absurd lr
                if "overflow" not in str(e):
                    raise
                raise _diverged(key, d, step, f"the optimizer step overflowed ({e})") from e
            opt.zero_grad(set_to_none=True)
            run.curve.append(float(loss.detach()))
            advance(1)
            run.tokens += x.shape[0] * x.shape[1]
            run.step = step + 1
            if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0 and run.step < end:
                checkpoint.save(d, run.meta, block, opt, run.gen, run.curve, run.step)
            if run.on_step is not None:
                run.on_step(run.step, run.curve[-1])
            if sleep:
                time.sleep(sleep)
    run.seconds += time.perf_counter() - t0


def setup(project: ProjectConfig, key: str, *, targets: str | None = None, restart: bool | str = False,
          layout: Layout = Layout()) -> Run:
    """Build block KEY's run: a fresh start (init weights + checkpoint 0 written) or a resume from its checkpoint.

    ``restart="auto"`` (zg repro) resumes only an unfinished checkpoint of this very run and otherwise starts
    afresh, as `dvc repro` does when it deletes a stale stage's outputs.
    """
    from zgdata.families import config_from_dict

    blk = project.block(key)
    spec, cfg = blk.spec, blk.train
    cfg = replace(cfg, targets=targets) if targets else cfg
    set_threads(cfg.threads)
    tensors, smeta = load_slice(layout.teacher_slice(key))
    if (smeta.get("in"), smeta.get("out")) != (spec.input, spec.output):
        raise ZgError(f"teacher slice for {key} covers {smeta.get('in')}->{smeta.get('out')}, params say "
                      f"{spec.input}->{spec.output}", fix="re-run `dvc repro teacher` after changing the partition")
    src = open_targets(cfg.targets, layout, spec, project.partition, project.materialize)
    check(f"the boundaries of {key}", src.lineage, f"its teacher slice {layout.teacher_slice(key).name}",
          {"teacher_sha256": smeta.get("teacher_sha256")}, keys=("teacher_sha256",),
          fix="pull or rebuild both from one commit (`dvc repro teacher materialize`)")
    seed = block_seed(project.seed, cfg.seed, key)
    identity = {"key": key, "in": spec.input, "out": spec.output, "seed": seed, "trainer_version": TRAINER_VERSION,
                "config": {k: v for k, v in asdict(cfg).items() if k not in _NOT_IDENTITY},
                "fingerprints": src.fingerprints, "teacher_sha256": smeta["teacher_sha256"]}
    d = layout.block_dir(key)
    prior = None if restart is True else checkpoint.read_meta(d)
    if restart == "auto" and prior is not None and (prior.get("done")
                                                    or {k: prior.get(k) for k in identity} != identity):
        prior = None
    if prior is not None and {k: prior.get(k) for k in identity} != identity:
        flat_a = {**{k: prior.get(k) for k in identity if k != "config"}, **(prior.get("config") or {})}
        flat_b = {**{k: v for k, v in identity.items() if k != "config"}, **identity["config"]}
        raise ZgError(f"models/blocks/{key} holds a checkpoint of another run ({_diff(flat_a, flat_b)})",
                      fix="rerun with --restart to discard it, or restore the old params")
    # read (and checksum) the data before anything in the block directory changes
    xs, ys = (t.float() for t in src.take(src.rows("train")[: cfg.importance_rows]))
    if prior is None:
        shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)

    gen = seed_all(seed)
    block = convert(cfg.conversion, tensors, config_from_dict(smeta["config"]), cfg, xs, gen).to(device())
    objective = Objective(cfg.objective, normalize=cfg.normalize, sigma=cfg.noise_sigma, x_sample=xs, y_sample=ys,
                          device=device())
    opt = torch.optim.AdamW(block.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    meta = {**identity, "teacher_config": smeta["config"], "teacher_layers": smeta["layers"],
            "intermediate_sizes": block.intermediate_sizes, "windows": block.windows, "params": sum(p.numel() for p in block.parameters()),
            "teacher_params": sum(v.numel() for v in tensors.values()), "steps": cfg.steps, "done": False,
            "state_sha256": None}
    run = Run(key=key, cfg=cfg, dir=d, meta=meta, block=block, opt=opt, gen=gen, objective=objective, src=src,
              seed=seed)
    if prior is None:
        checkpoint.save_weights(block.weights(), d / "init.safetensors")
        checkpoint.save(d, meta, block, opt, gen, run.curve, 0)
    else:
        run.curve = checkpoint.restore(d, prior, block, opt, gen)
        run.step = prior["step"]
    return run


def _train_loss(curve: list) -> float | None:
    return float(np.mean(curve[-10:])) if curve else None


@locked("block")
def train_block(project: ProjectConfig, key: str, *, targets: str | None = None, stop_after: int | None = None,
                restart: bool | str = False, layout: Layout = Layout(), on_step=None) -> dict:
    """Train block KEY to train.steps (or ``stop_after`` more steps), checkpointing; resumes where it stopped."""
    if stop_after is not None and stop_after < 1:
        raise ZgError(f"--stop-after is {stop_after}", key="--stop-after", fix="give a number of steps >= 1")
    run = setup(project, key, targets=targets, restart=restart, layout=layout)
    run.on_step = on_step
    cfg, d = run.cfg, run.dir
    end = cfg.steps if stop_after is None else min(cfg.steps, run.step + stop_after)
    fit(run, end)
    sha = checkpoint.state_sha256(run.block, run.opt)
    if end < cfg.steps:
        checkpoint.save(d, run.meta, run.block, run.opt, run.gen, run.curve, end)
        return {"key": key, "status": "stopped", "step": end, "steps": cfg.steps, "state_sha256": sha,
                "train_loss": _train_loss(run.curve)}
    run.block.eval()
    heldout = _heldout(run.block, run.src, cfg)
    run.meta.update(done=True, state_sha256=sha)
    checkpoint.finish(d, run.meta, run.block, run.opt, run.gen, run.curve, cfg.steps)
    metrics = {"key": key, "steps": cfg.steps, "train_loss": _train_loss(run.curve),
               "first_loss": run.curve[0] if run.curve else None, "heldout_loss": heldout,
               "tokens_per_s": run.tokens / run.seconds if run.seconds > 0 and run.tokens else None,
               "params": run.meta["params"], "teacher_params": run.meta["teacher_params"],
               "param_ratio": run.meta["params"] / run.meta["teacher_params"],
               **kv_summary(run.meta["teacher_config"], run.block.windows, len(run.meta["teacher_layers"])),
               "objective": cfg.objective, "conversion": cfg.conversion, "targets": cfg.targets,
               "state_sha256": sha, "status": "done", "step": cfg.steps}
    write_json(layout.block_metrics(key), metrics)
    write_text(layout.block_loss_curve(key), "step,loss\n" + "".join(f"{i},{v:.6g}\n" for i, v in enumerate(run.curve)))
    return metrics

"""Train one block alone from its boundary pair, with its own seed, optimizer, RNG and checkpoints.

models/blocks/KEY/
  meta.json           run identity (config, boundary fingerprints, teacher sha256, code version) + step;
                      it names the latest complete checkpoint and is replaced atomically after it
  init.safetensors    the converted, untrained block (for "untrained" evaluation)
  ckpt-NNNNNN/        model.safetensors, optimizer.pt, rng.pt, curve.json
  model.safetensors   final weights (when done)
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from zgdata.atomic import write_json, write_text
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.errors import ZgError
from zgdata.hashing import sha256_bytes, tensors_sha256
from zgdata.layout import Layout
from zgdata.lock import locked
from zgdata.progress import progress
from zgdata.runtime import device
from zgdata.teacher import load_slice
from zgtrain.config import TrainConfig, block_config
from zgtrain.conversions import convert
from zgtrain.objectives import Objective, nmse
from zgtrain.targets import open_targets

__all__ = ["train_block", "block_seed", "state_sha256", "load_block", "TRAINER_VERSION"]

TRAINER_VERSION = 1
# Keys that do not change the trained bits, so a resume may change them.
_NOT_IDENTITY = ("targets", "checkpoint_every")


def block_seed(global_seed: int, offset: int, key: str) -> int:
    """A stable per-block seed: independent of process, Python hash seed and block order."""
    return int(sha256_bytes(f"{global_seed}/{offset}/{key}".encode())[:15], 16)


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - cfg.warmup, 1)
    p = min((step - cfg.warmup) / span, 1.0)
    if cfg.schedule == "cosine":
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    if cfg.schedule == "linear":
        return cfg.lr * (1 - p)
    return cfg.lr


def state_sha256(block, opt) -> str:
    """sha256 over final weights and optimizer tensors, in canonical order."""
    tensors = {f"model.{k}": v for k, v in block.weights().items()}
    names = {id(p): n for n, p in block.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v):
                    tensors[f"opt.{names[id(p)]}.{k}"] = v
    return tensors_sha256(tensors)


def _save_weights(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


def _checkpoint(d: Path, meta: dict, block, opt, gen, curve: list, step: int) -> None:
    """Write ckpt-STEP/ fully, then point meta.json at it (atomic rename), then drop older ones."""
    name = f"ckpt-{step:06d}"
    tmp = d / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_weights(block.weights(), tmp / "model.safetensors")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save({"block": gen.get_state(), "torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()}, tmp / "rng.pt")
    (tmp / "curve.json").write_text(json.dumps(curve))
    shutil.rmtree(d / name, ignore_errors=True)
    os.replace(tmp, d / name)
    write_json(d / "meta.json", {**meta, "step": step, "checkpoint": name})
    for old in d.glob("ckpt-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def _restore(d: Path, name: str, block, opt, gen) -> list:
    from safetensors.torch import load_file

    c = d / name
    block.load_state_dict(load_file(str(c / "model.safetensors")), strict=False)
    opt.load_state_dict(torch.load(c / "optimizer.pt", weights_only=False))
    rng = torch.load(c / "rng.pt", weights_only=False)
    gen.set_state(rng["block"])
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    return json.loads((c / "curve.json").read_text())


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


def load_block(layout: Layout, key: str, *, which: str = "final"):
    """(StudentBlock, meta) of a trained block: ``final`` weights or the untrained ``init`` weights."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from zgtrain.block_model import StudentBlock

    d = layout.block_dir(key)
    meta_path = d / "meta.json"
    if not meta_path.exists():
        raise ZgError(f"block {key} has not been trained ({meta_path} missing)", fix=f"run `dvc repro train@{key}`")
    meta = json.loads(meta_path.read_text())
    if which == "final" and not meta.get("done"):
        raise ZgError(f"block {key} stopped at step {meta['step']} of {meta['config']['steps']}",
                      fix=f"finish it with `zg train block {key}` or `dvc repro train@{key}`")
    config = LlamaConfig.from_dict(meta["teacher_config"])
    block = StudentBlock(config, meta["intermediate_sizes"])
    block.load_state_dict(load_file(str(d / ("model.safetensors" if which == "final" else "init.safetensors"))),
                          strict=False)
    return block.eval(), meta


def _diverged(key: str, d: Path, step: int, what: str) -> ZgError:
    good = json.loads((d / "meta.json").read_text())["step"]
    return ZgError(f"block {key}: {what} at step {step}; the last good checkpoint (step {good}) is intact",
                   key=f"blocks.{key}", fix="lower train.lr (or blocks.KEY.lr) and rerun with --restart")


def _steps(block, opt, gen, objective, src, cfg: TrainConfig, *, key, d, meta, curve, start, end, seed) -> int:
    """Optimizer steps [start, end): the only place the block's parameters change."""
    tokens = 0
    sleep = float(os.environ.get("ZG_FAILPOINT_SLEEP_AFTER_STEP", "0"))  # test hook: widen kill window
    dev = next(block.parameters()).device
    block.train()
    with progress(f"train {key}", end - start, unit="step") as advance:
        for step, rows, x, y in src.batches("train", start_step=start, steps=end, batch_size=cfg.batch_size, seed=seed):
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, step)
            inp, tgt = objective.batch(x.to(dev).float(), y.to(dev).float(), gen)
            loss = objective.loss(block(inp), tgt)
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
            curve.append(float(loss.detach()))
            advance(1)
            tokens += x.shape[0] * x.shape[1]
            done_steps = step + 1
            if cfg.checkpoint_every and done_steps % cfg.checkpoint_every == 0 and done_steps < end:
                _checkpoint(d, meta, block, opt, gen, curve, done_steps)
            if sleep:
                time.sleep(sleep)
    return tokens


@locked("block")
def train_block(params: dict, key: str, *, targets: str | None = None, stop_after: int | None = None,
                restart: bool = False, layout: Layout = Layout()) -> dict:
    from transformers import LlamaConfig

    part = section(params, PartitionConfig, "partition")
    cfg = block_config(params, key)
    cfg = replace(cfg, targets=targets) if targets else cfg
    if cfg.targets not in ("cached", "online"):
        raise ZgError(f"--targets is '{cfg.targets}'", key="train.targets", fix="use cached or online")
    spec = part.block(key, params["blocks"][key])
    tensors, smeta = load_slice(layout.teacher_slice(key))
    if (smeta.get("in"), smeta.get("out")) != (spec.input, spec.output):
        raise ZgError(f"teacher slice for {key} covers {smeta.get('in')}->{smeta.get('out')}, params say "
                      f"{spec.input}->{spec.output}", fix="re-run `dvc repro teacher` after changing the partition")
    src = open_targets(cfg.targets, layout, spec, part, section(params, MaterializeConfig, "materialize"))
    if src.lineage["teacher_sha256"] != smeta["teacher_sha256"]:
        raise ZgError(f"boundaries of {key} come from teacher {src.lineage['teacher_sha256'][:12]} but its teacher "
                      f"slice is from {smeta['teacher_sha256'][:12]}",
                      fix="pull or rebuild both from one commit (`dvc repro teacher materialize`)")
    seed = block_seed(int(params.get("seed", 0)), cfg.seed, key)
    identity = {"key": key, "in": spec.input, "out": spec.output, "seed": seed, "trainer_version": TRAINER_VERSION,
                "config": {k: v for k, v in asdict(cfg).items() if k not in _NOT_IDENTITY},
                "fingerprints": src.fingerprints, "teacher_sha256": smeta["teacher_sha256"]}
    d = layout.block_dir(key)
    prior = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else None
    if prior is not None and restart:
        prior = None
    if prior is not None and {k: prior.get(k) for k in identity} != identity:
        flat_a = {**{k: prior.get(k) for k in identity if k != "config"}, **(prior.get("config") or {})}
        flat_b = {**{k: v for k, v in identity.items() if k != "config"}, **identity["config"]}
        raise ZgError(f"models/blocks/{key} holds a checkpoint of another run ({_diff(flat_a, flat_b)})",
                      fix="rerun with --restart to discard it, or restore the old params")
    if prior is None:
        shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed % (2**63))
    np.random.seed(seed % (2**32))
    random.seed(seed)
    gen = torch.Generator().manual_seed(seed % (2**63))
    sample_rows = src.rows("train")[: cfg.importance_rows]
    xs, ys = (t.float() for t in src.take(sample_rows))
    config = LlamaConfig.from_dict(smeta["config"])
    block = convert(cfg.conversion, tensors, config, cfg, xs, gen).to(device())
    teacher_params = sum(v.numel() for v in tensors.values())
    n_params = sum(p.numel() for p in block.parameters())
    objective = Objective(cfg.objective, normalize=cfg.normalize, sigma=cfg.noise_sigma, x_sample=xs, y_sample=ys,
                          device=device())
    opt = torch.optim.AdamW(block.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    meta = {**identity, "teacher_config": smeta["config"], "teacher_layers": smeta["layers"],
            "intermediate_sizes": block.intermediate_sizes, "params": n_params, "teacher_params": teacher_params,
            "steps": cfg.steps, "done": False, "state_sha256": None}
    curve: list = []
    start = 0
    if prior is None:
        _save_weights(block.weights(), d / "init.safetensors")
        _checkpoint(d, meta, block, opt, gen, curve, 0)
    else:
        curve = _restore(d, prior["checkpoint"], block, opt, gen)
        start = prior["step"]
    end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    t0 = time.perf_counter()
    tokens = _steps(block, opt, gen, objective, src, cfg, key=key, d=d, meta=meta, curve=curve, start=start, end=end,
                    seed=seed)
    seconds = time.perf_counter() - t0
    sha = state_sha256(block, opt)
    if end < cfg.steps:
        _checkpoint(d, meta, block, opt, gen, curve, end)
        return {"key": key, "status": "stopped", "step": end, "steps": cfg.steps, "state_sha256": sha,
                "train_loss": float(np.mean(curve[-10:])) if curve else float("nan")}
    block.eval()
    heldout = _heldout(block, src, cfg)
    meta.update(done=True, state_sha256=sha)
    _save_weights(block.weights(), d / "model.safetensors")  # before meta.json says done, so done implies it exists
    _checkpoint(d, meta, block, opt, gen, curve, cfg.steps)
    metrics = {"key": key, "steps": cfg.steps, "train_loss": float(np.mean(curve[-10:])) if curve else None,
               "first_loss": curve[0] if curve else None, "heldout_loss": heldout,
               "tokens_per_s": tokens / seconds if seconds > 0 and tokens else None, "params": n_params,
               "teacher_params": teacher_params, "param_ratio": n_params / teacher_params,
               "objective": cfg.objective, "conversion": cfg.conversion, "targets": cfg.targets,
               "state_sha256": sha, "status": "done", "step": cfg.steps}
    write_json(layout.block_metrics(key), metrics)
    write_text(layout.block_loss_curve(key), "step,loss\n" + "".join(f"{i},{v:.6g}\n" for i, v in enumerate(curve)))
    return metrics

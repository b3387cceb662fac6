"""Greedy local pretraining, simultaneous mode: every block trains on every batch, isolated by detach.

Block k's input is block k-1's output, detached; each block has its own AdamW, generator and
checkpoint (zgtrain/fit/checkpoint.py's format, one directory per block). A checkpoint of the run is
one folder ``models/local/run/ckpt-NNNNNN/`` holding every block's, written whole and then named
by an atomic rewrite of ``run/meta.json``: a ``kill -9`` resumes every block from the same step.
The steps run in the shared loop (zgtrain/fit/loop.py); this module passes in the seeded batches,
one step of every block (the schedule's) and that one-folder checkpoint.

The batches are a pure function of (params seed, local.seed, step): K, aux, mtp and the schedule
never change which tokens an arm sees, and each block's loss curve records a digest of each batch.
``schedule`` only changes when work is issued (zgtrain/local/schedule.py), never the bits.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from zgdata.core.atomic import atomic_path, write_json, write_text
from zgdata.core.hashing import sha256_bytes
from zgdata.core.lock import project_lock
from zgdata.core.metrics_file import write_metrics
from zgdata.core.runtime import device, set_threads
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import read_tokens_json
from zgdata.store.reader import check_batch, step_rows
from zgdata.teacher.prepare import load_tokenizer, read_teacher_json
from zgdata.tokens.store import open_tokens, read_tokens
from zgtrain.fit import checkpoint, loop
from zgtrain.fit.identity import resumable
from zgtrain.fit.schedule import block_seed, lr_at
from zgtrain.local.model import build_model, llama_config, make_blocks
from zgtrain.local.schedule import SCHEDULES
from zgtrain.project.config import ProjectConfig
from zgtrain.project.local import LocalConfig

__all__ = [
    "train_local",
    "build",
    "setup",
    "fit",
    "adamw",
    "local_lr",
    "LocalRun",
    "LocalResult",
    "heldout_scores",
    "LOCAL_VERSION",
]

LOCAL_VERSION = 1


def local_lr(cfg: LocalConfig, step: int) -> float:
    """Local pretraining's learning rate: warmup, then cosine to 10% (``cfg.schedule`` is the block schedule)."""
    return lr_at(cfg, step, "cosine")


@dataclass(kw_only=True)
class LocalRun(loop.RunState):
    cfg: LocalConfig
    keys: list
    blocks: list
    opts: list
    gens: list
    model: object
    tokenizer: object
    ids: torch.Tensor  # (N, T) every token row, train and heldout
    train_rows: np.ndarray
    heldout_rows: np.ndarray
    data_seed: int
    identity: dict
    layout: Layout
    curves: list = field(default_factory=list)
    state: dict = field(default_factory=dict)  # per-schedule scratch (CUDA streams)
    bcfgs: list = field(default_factory=list)  # per block: local: with local.blocks.KEY applied
    dir: Path | None = None  # where checkpoints go: layout.local_run, or a restart's staging folder beside it


@dataclass(kw_only=True)
class LocalResult(loop.Result):
    """What ``train_local`` returns; ``metrics()`` is metrics/local.json (a stopped run: its STOPPED keys)."""

    STOPPED = (
        "status",
        "step",
        "steps",
        "k",
        "schedule",
        "aux",
        "mtp",
        "tokens_sha256",
        "state_sha256",
        "block_state_sha256",
    )
    status: str
    step: int
    steps: int
    k: int
    schedule: str
    aux: str
    mtp: str
    tokens_sha256: str
    state_sha256: str
    block_state_sha256: dict
    heldout_ce: float | None = None
    block_ce: dict | None = None
    heldout_tokens: int | None = None
    train_loss: dict | None = None
    tokens_seen: int | None = None
    params: int | None = None
    local_params: int | None = None
    tokens_per_s: float | None = None


def _check_partition(project: ProjectConfig) -> list[int]:
    b, layers = project.partition.boundaries, project.local.layers
    if b[0] != 0 or b[-1] != layers:
        raise ZgError(
            f"partition.boundaries {b} does not cut local.layers={layers} into blocks",
            key="partition.boundaries",
            fix=f"run from 0 to {layers}, e.g. [0, {layers}] (K=1) or [0, {layers // 2}, {layers}] (K=2), "
            f"then `zg pipeline`",
        )
    return list(b)


def _save(run: LocalRun, *, done: bool = False, extra: dict | None = None) -> None:
    """Every block's checkpoint of run.step in one folder, then meta.json names it, then older ones go."""
    d, name = run.dir or run.layout.local_run, f"ckpt-{run.step:06d}"
    with atomic_path(d / name) as tmp:
        for k, blk, opt, gen, curve in zip(run.keys, run.blocks, run.opts, run.gens, run.curves):
            checkpoint.save(tmp / k, {**run.identity, "key": k}, blk, opt, gen, curve, run.step)
    write_json(d / "meta.json", {**run.identity, "step": run.step, "checkpoint": name, "done": done, **(extra or {})})
    for old in d.glob("ckpt-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def _publish(run: LocalRun, *, stopped: bool) -> None:
    """Swap a restart's staging folder in; a stopped run leaves no exported model of an older run (this mode's
    outputs only: a sequential run's models/local/blocks/ stays)."""
    loop.publish(run.dir, run.layout.local_run)
    run.dir = run.layout.local_run
    if stopped:
        shutil.rmtree(run.layout.local_hf, ignore_errors=True)


def _read_meta(path: Path) -> dict | None:
    import json

    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is not valid JSON ({e})", fix="rerun with `zg train local --restart`") from e


def build(project: ProjectConfig, layout: Layout) -> LocalRun:
    """The run's data, model and blocks at their seeded init (no optimizer, nothing read from a checkpoint)."""
    cfg = project.local
    boundaries = _check_partition(project)
    set_threads(cfg.threads)
    tok = load_tokenizer(layout)
    rec = read_tokens_json(layout)
    teacher = read_teacher_json(layout)
    ids, splits = read_tokens(layout, None, ds=open_tokens(layout))
    splits = np.asarray(splits)
    train_rows, heldout_rows = np.flatnonzero(splits == "train"), np.flatnonzero(splits == "heldout")
    if not len(train_rows) or not len(heldout_rows):
        raise ZgError(
            f"{layout.tokens} has {len(train_rows)} train and {len(heldout_rows)} held-out rows",
            key="corpus.heldout",
            fix="local training needs both: check corpus.heldout and the row caps",
        )
    check_batch(cfg.batch_size, len(train_rows), "local.batch_size")
    if cfg.heldout_seqs:
        heldout_rows = heldout_rows[: cfg.heldout_seqs]
    vocab = len(tok)
    if int(ids.max()) >= vocab:
        raise ZgError(
            f"{layout.tokens} holds token id {int(ids.max())}, beyond the tokenizer's {vocab}",
            fix="re-run `dvc repro tokens` with this teacher",
        )
    config = llama_config(
        cfg,
        vocab_size=vocab,
        max_positions=ids.shape[1],
        bos=tok.bos_token_id,
        eos=tok.eos_token_id,
        pad=tok.pad_token_id,
    )
    keys = [b.key for b in project.partition.blocks()]
    seeds = [block_seed(project.seed, cfg.seed, f"local/{k}") for k in keys]
    gens = [torch.Generator().manual_seed(s % (2**63)) for s in seeds]
    model = build_model(config, block_seed(project.seed, cfg.seed, "local/trunk"))
    blocks = make_blocks(model, boundaries, cfg, gens)
    dev = device()
    model.to(dev)
    for blk in blocks:
        blk.to(dev).train()
    identity = {
        "local_version": LOCAL_VERSION,
        "seed": project.seed,
        "boundaries": boundaries,
        "keys": keys,
        "config": cfg.identity(),
        "tokens_fingerprint": rec["fingerprint"],
        "tokenizer_sha256": teacher["tokenizer_sha256"],
    }
    return LocalRun(
        cfg=cfg,
        keys=keys,
        blocks=blocks,
        opts=[],
        gens=gens,
        model=model,
        tokenizer=tok,
        ids=ids,
        train_rows=train_rows,
        heldout_rows=heldout_rows,
        identity=identity,
        layout=layout,
        data_seed=block_seed(project.seed, cfg.seed, "local/data"),
        curves=[[] for _ in keys],
        bcfgs=[cfg.of(k) for k in keys],
    )


def adamw(blk, cfg: LocalConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(blk.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)


def setup(project: ProjectConfig, *, restart: bool = False, layout: Layout = Layout()) -> LocalRun:
    """Build the run from params and data; resume it from its checkpoint when one of this very run exists."""
    if project.local.mode != "simultaneous":
        raise ZgError(
            "local.mode is sequential: its blocks train one DVC stage each",
            key="local.mode",
            fix="run `zg pipeline` if dvc.yaml has no local_bNN stages yet, then `dvc repro` (or `zg train local-block KEY`)",
        )
    run = build(project, layout)
    run.opts = [adamw(blk, c) for blk, c in zip(run.blocks, run.bcfgs)]
    d = layout.local_run
    prior = resumable(
        None if restart else _read_meta(d / "meta.json"),
        run.identity,
        where=str(d),
        fix="rerun with `zg train local --restart` to discard it, or restore the old params",
    )
    run.dir = loop.begin(d, prior)  # a restart builds beside the old folder; _publish swaps it in
    if prior is None:
        _save(run)
    else:
        c = checkpoint.checkpoint_dir(d, prior, fix="rerun with `zg train local --restart`")
        for i, k in enumerate(run.keys):
            bmeta = checkpoint.read_meta(c / k)
            if bmeta is None:
                raise ZgError(
                    f"{c / k / 'meta.json'} is missing (run/meta.json points at it)",
                    fix="rerun with `zg train local --restart`",
                )
            run.curves[i] = checkpoint.restore(c / k, bmeta, run.blocks[i], run.opts[i], run.gens[i])
        run.step = prior["step"]
    return run


def _steps(run: LocalRun) -> loop.Steps:
    """Simultaneous mode's part of the loop: one seeded batch, every block updated once in the schedule's order."""
    cfg, dev = run.cfg, next(run.model.parameters()).device
    schedule = SCHEDULES[cfg.schedule]

    def batches(start: int, end: int):
        for step in range(start, end):
            yield step, run.ids[step_rows(run.train_rows, step, cfg.batch_size, run.data_seed)]

    def fail(step: int, what: str, who: str = "local blocks") -> ZgError:
        return loop.diverged(who, step, what, key="local.lr", fix="lower local.lr and rerun with --restart")

    def work(step: int, batch: torch.Tensor) -> int:
        digest = sha256_bytes(batch.numpy().tobytes())[:16]
        results = schedule(run, batch.to(dev))
        for i, (loss, terms) in enumerate(results):  # one sync per step, after every block's work is issued
            value = float(loss.detach())
            if not math.isfinite(value):
                raise fail(step, f"loss became {value}", who=f"local block {run.keys[i]}")
            run.curves[i].append({"loss": value, **{k: float(v) for k, v in terms.items()}, "batch": digest})
        return batch.numel()

    return loop.Steps(
        name="train local",
        batches=batches,
        work=work,
        save=lambda step: _save(run),
        lrs=[(opt, lambda s, c=c: local_lr(c, s)) for opt, c in zip(run.opts, run.bcfgs)],
        checkpoint_every=cfg.checkpoint_every,
        fail=fail,
    )


def fit(run: LocalRun, end: int) -> None:
    """Steps [run.step, end): one seeded batch each, every block updated once (the schedule decides the order)."""
    loop.fit(run, end, _steps(run))


def state_sha256(run: LocalRun) -> dict:
    per = {k: checkpoint.state_sha256(b, o) for k, b, o in zip(run.keys, run.blocks, run.opts)}
    return {"state_sha256": sha256_bytes("".join(per[k] for k in run.keys).encode()), "block_state_sha256": per}


def tokens_sha256(run: LocalRun) -> str:
    """Digest of every batch the run trained on, in order (block 0's record; every block records the same)."""
    return sha256_bytes("".join(c["batch"] for c in run.curves[0]).encode())


@torch.no_grad()
def heldout_scores(hf: Path, blocks: list, keys: list, ids: torch.Tensor, batch_size: int) -> dict:
    """Full-model CE of the saved transformers folder ``hf``, and each block's local (head) CE, on rows ``ids``."""
    from transformers import AutoModelForCausalLM

    from zgtrain.evaluate.metrics import token_nll

    dev = next(blocks[0].parameters()).device
    model = AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=False).to(dev).eval()  # stock classes
    ce = float(token_nll(model, ids, batch_size).mean())
    sums = [0.0] * len(blocks)
    for blk in blocks:
        blk.eval()
    for i in range(0, len(ids), batch_size):
        x = y = ids[i : i + batch_size].to(dev)
        for j, blk in enumerate(blocks):
            x, _, terms = blk(x, y)
            sums[j] += float(terms["next"]) * len(y)
    return {
        "heldout_ce": ce,
        "block_ce": {k: s / len(ids) for k, s in zip(keys, sums)},
        "heldout_tokens": int(ids[:, 1:].numel()),
    }


def train_local(
    project: ProjectConfig, *, stop_after: int | None = None, restart: bool = False, layout: Layout = Layout()
) -> LocalResult:
    """Train every block to local.steps (or ``stop_after`` more steps), checkpointing; resumes where it stopped."""
    loop.check_stop_after(stop_after)
    with project_lock(layout, "local", writes=layout.local_dir):
        run = setup(project, restart=restart, layout=layout)
        cfg = run.cfg
        end = loop.end_step(cfg.steps, run.step, stop_after)
        fit(run, end)
        shas = state_sha256(run)
        base = {
            "step": end,
            "steps": cfg.steps,
            "k": len(run.blocks),
            "schedule": cfg.schedule,
            "aux": cfg.aux,
            "mtp": cfg.mtp,
            "tokens_sha256": tokens_sha256(run),
            **shas,
        }
        if end < cfg.steps:
            _save(run)
            _publish(run, stopped=True)
            return LocalResult(status="stopped", **base)
        for blk in run.blocks:
            blk.eval()
        with atomic_path(layout.local_hf) as tmp:
            run.model.save_pretrained(tmp)
            run.tokenizer.save_pretrained(tmp)
        scores = heldout_scores(layout.local_hf, run.blocks, run.keys, run.ids[run.heldout_rows], cfg.eval_batch_size)
        _save(run, done=True, extra={"state_sha256": shas["state_sha256"]})
        _publish(run, stopped=False)
        n_model = sum(p.numel() for p in run.model.parameters())
        result = LocalResult(
            status="done",
            **base,
            **scores,
            train_loss=_train_losses(run.keys, run.curves),
            tokens_seen=cfg.steps * cfg.batch_size * int(run.ids.shape[1]),
            params=n_model,
            local_params=sum(p.numel() for b in run.blocks for p in b.parameters()) - n_model,
            tokens_per_s=run.tokens_per_s(),
        )
        write_metrics(layout.local_metrics, result.metrics())
        write_text(
            layout.local_loss_curve,
            "step,"
            + ",".join(run.keys)
            + "\n"
            + "".join(
                f"{s}," + ",".join(f"{c[s]['loss']:.6g}" for c in run.curves) + "\n" for s in range(len(run.curves[0]))
            ),
        )
        return result


def _train_losses(keys: list, curves: list) -> dict:
    """Each block's reported train loss: the mean of its last 10 losses."""
    return {k: loop.mean_tail([c["loss"] for c in curve]) for k, curve in zip(keys, curves)}

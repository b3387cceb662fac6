"""Train one block alone from its boundary pair, with its own seed, optimizer, RNG and checkpoints.

``setup`` builds a run (converted block, optimizer, objective, data source) and either starts
it or restores it from its checkpoint; ``fit`` runs optimizer steps in the shared loop
(zgtrain/fit/loop.py: this module passes in the batches and one step's work); ``train_block`` is
both plus the final ``BlockResult``. zgtrain/fit/checkpoint.py owns the files under models/blocks/KEY/,
zgtrain/fit/identity.py decides whether a checkpoint there resumes, zgtrain/fit/schedule.py the seed
and learning rates.

A block with linear_attention layers (zgtrain/block/attention.py) trains in two phases on one step counter: the
first ``train.transfer_steps`` steps (0: a quarter of train.steps) are attention transfer, which trains only the
feature maps, to each layer's teacher attention output on the teacher's own stream from the block's input
(``transfer_loss``; the teacher block is rebuilt from the slice, frozen); the rest are the usual boundary
regression of all the block's parameters. The phase is a function of the step, so a checkpoint's step says where a
resumed run stands, and one optimizer (whose state the checkpoints hold) serves both: parameters that get no
gradient in phase 1 get no AdamW update either.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from zgdata.core.atomic import write_text
from zgdata.core.lock import locked
from zgdata.core.metrics_file import read_timings, write_metrics
from zgdata.core.paths_guard import inside
from zgdata.core.runtime import autocast, device, seed_all, set_threads
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import check
from zgdata.store.reader import check_batch
from zgdata.teacher.prepare import load_slice
from zgtrain.block.attention import LinearAttention, transfer_loss, transfer_parameters
from zgtrain.block.conversions import convert
from zgtrain.block.experts import active_params, teacher_active
from zgtrain.block.kv_cache import kv_summary
from zgtrain.block.objectives import Objective, nmse
from zgtrain.block.targets import open_targets
from zgtrain.fit import checkpoint, loop
from zgtrain.fit.identity import matches, resumable
from zgtrain.fit.rerun import Rerun, rerun_of
from zgtrain.fit.schedule import block_seed, lr_at
from zgtrain.project.config import ProjectConfig, TrainConfig

__all__ = ["train_block", "setup", "fit", "Run", "BlockResult", "TRAINER_VERSION"]

TRAINER_VERSION = 1


def _heldout(block, targets, cfg: TrainConfig) -> float:
    rows = targets.rows("heldout")
    if cfg.heldout_rows:
        rows = rows[: cfg.heldout_rows]
    err = spread = 0.0
    where = next(block.parameters()).device
    with torch.no_grad():
        for i in range(0, len(rows), cfg.batch_size):
            x, y = targets.take(rows[i : i + cfg.batch_size])
            e, d = nmse(block(x.to(where).float()), y.to(where).float())
            err, spread = err + e, spread + d
    return err / max(spread, 1e-30)


def _lr_key(r: Rerun) -> str:
    """The params key of a block's own lr: blocks.KEY.lr, or a variant's variants.NAME.lr."""
    name = r.folder.rsplit("/", 1)[-1]  # the block's key, or the variant's name
    return f"variants.{name}.lr" if r.stage.startswith("variant@") else f"blocks.{name}.lr"


def _diverged(key: str, d: Path):
    run = rerun_of(d)

    def fail(step: int, what: str) -> ZgError:
        return loop.diverged(
            f"block {key}",
            step,
            what,
            key=f"blocks.{key}",
            good=checkpoint.read_meta(d)["step"],
            fix=f"lower train.lr (or {_lr_key(run)}) and rerun with `{run.restart}`",
        )

    return fail


@dataclass(kw_only=True)
class Run(loop.RunState):
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
    curve: list = field(default_factory=list)
    finished: bool = False
    """Resumed from a finished run: train_block rewrites nothing (its weights are checked against meta.json)."""
    prior: dict | None = None
    """The meta.json it resumed from (a finished run's checkpoint is read only if its metrics must be rebuilt)."""
    on_step: object = None
    """Optional ``on_step(step, loss)`` after each optimizer step (zg repro's progress); never changes the run."""
    teacher: torch.nn.Module | None = None
    """The frozen teacher block of attention transfer (linear_attention blocks only)."""
    transfer_steps: int = 0
    """Steps [0, transfer_steps) are attention transfer (linear_attention blocks only)."""


@dataclass(kw_only=True)
class BlockResult(loop.Result):
    """What ``train_block`` returns; ``metrics()`` is metrics/blocks/KEY.json (a stopped run: its first six keys)."""

    STOPPED = ("key", "status", "step", "steps", "state_sha256", "train_loss")
    key: str
    steps: int
    train_loss: float | None
    first_loss: float | None = None
    heldout_loss: float | None = None
    tokens_per_s: float | None = None
    params: int | None = None
    teacher_params: int | None = None
    param_ratio: float | None = None
    kv: dict = field(default_factory=dict, metadata={"spread": True})  # kv_summary's keys, in its order
    # a mixture-of-experts block: active_params and teacher_active_params (parameters one token runs); {} if dense
    experts: dict = field(default_factory=dict, metadata={"spread": True})
    objective: str | None = None
    conversion: str | None = None
    targets: str | None = None
    state_sha256: str
    status: str
    step: int


def _steps(run: Run) -> loop.Steps:
    """Block training's part of the loop: seeded batches of the boundary pair, the objective's loss."""
    cfg, block, opt = run.cfg, run.block, run.opt
    dev = next(block.parameters()).device
    fail = _diverged(run.key, run.dir)

    def batches(start: int, end: int):
        for step, _, x, y in run.src.batches(
            "train", start_step=start, steps=end, batch_size=cfg.batch_size, seed=run.seed, device=dev
        ):
            yield step, (x, y)

    def work(step: int, batch) -> int:
        x, y = batch
        if step < run.transfer_steps:  # attention transfer: only the feature maps get gradients
            with _only(block, transfer_parameters(block)):
                with autocast(dev, cfg.precision):
                    loss = transfer_loss(run.teacher, block, x.to(dev).float())
                loop.update(loss, block.parameters(), opt, cfg.grad_clip, lambda what: fail(step, what))
            run.curve.append(float(loss.detach()))
            return x.shape[0] * x.shape[1]
        inp, tgt = run.objective.batch(x.to(dev).float(), y.to(dev).float(), run.gen)
        with autocast(dev, cfg.precision):
            loss = run.objective.loss(block(inp), tgt)
        loop.update(loss, block.parameters(), opt, cfg.grad_clip, lambda what: fail(step, what))
        run.curve.append(float(loss.detach()))
        return x.shape[0] * x.shape[1]

    def on_step(step: int) -> None:
        if run.on_step is not None:
            run.on_step(step, run.curve[-1])

    return loop.Steps(
        name=f"train {run.key}",
        batches=batches,
        work=work,
        lrs=[(opt, lambda s: lr_at(cfg, s))],
        save=lambda step: checkpoint.save(run.dir, run.meta, block, opt, run.gen, run.curve, step),
        checkpoint_every=cfg.checkpoint_every,
        on_step=on_step,
        fail=fail,
    )


class _only:
    """Within: only the parameters named in ``names`` require gradients (the others get none, so no update)."""

    def __init__(self, block: torch.nn.Module, names: set[str]):
        self.params = [(p, p.requires_grad) for n, p in block.named_parameters() if n not in names]

    def __enter__(self):
        for p, _ in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p, was in self.params:
            p.requires_grad_(was)


def transfer_steps(cfg: TrainConfig, block: torch.nn.Module) -> int:
    """Attention-transfer steps of a block: none without linear_attention layers; else train.transfer_steps
    (0: a quarter of train.steps), at most train.steps."""
    if not any(isinstance(m, LinearAttention) for m in block.modules()):
        return 0
    return min(cfg.steps, cfg.transfer_steps or cfg.steps // 4)


def fit(run: Run, end: int) -> None:
    """Optimizer steps [run.step, end): the only place the block's parameters change."""
    run.block.train()
    loop.fit(run, end, _steps(run), timed="train.steps")


def setup(
    project: ProjectConfig,
    key: str,
    *,
    targets: str | None = None,
    restart: bool | str = False,
    layout: Layout = Layout(),
) -> Run:
    """Build block KEY's run: a fresh start (init weights + checkpoint 0 written) or a resume from its checkpoint.

    ``restart="auto"`` (zg repro) resumes only an unfinished checkpoint of this very run and otherwise starts
    afresh, as `dvc repro` does when it deletes a stale stage's outputs.
    """
    from zgdata.families.registry import config_from_dict

    blk = project.block(key)
    spec, cfg = blk.spec, blk.train
    cfg = replace(cfg, targets=targets) if targets else cfg
    set_threads(cfg.threads)
    tensors, smeta, src = _inputs(project, key, spec, cfg, layout)
    check_batch(cfg.batch_size, len(src.rows("train")), "train.batch_size")
    seed = block_seed(project.seed, cfg.seed, key)
    identity = _identity(key, spec, seed, cfg, src.fingerprints, smeta["teacher_sha256"])
    d = inside(layout.block_dir(key), layout.root, what=f"block {key}'s folder")
    prior, staged = _prior(d, identity, restart, key)
    # read (and checksum) the data before anything in the block directory changes
    xs, ys = (t.float() for t in src.take(src.rows("train")[: cfg.importance_rows]))
    # a fresh start over what d holds builds beside it; train_block swaps that folder in at the end
    d = loop.begin(d, prior, staged=staged)

    gen = seed_all(seed)
    block = convert(cfg.conversion, tensors, config_from_dict(smeta["config"]), cfg, xs, gen).to(device())
    objective = Objective(
        cfg.objective, normalize=cfg.normalize, sigma=cfg.noise_sigma, x_sample=xs, y_sample=ys, device=device()
    )
    opt = torch.optim.AdamW(block.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    meta = _meta(identity, smeta, block, tensors, cfg.steps)
    run = Run(
        key=key, cfg=cfg, dir=d, meta=meta, block=block, opt=opt, gen=gen, objective=objective, src=src, seed=seed
    )
    run.transfer_steps = transfer_steps(cfg, block)
    if run.transfer_steps:  # the frozen teacher of attention transfer, from the same slice (no draw)
        meta["transfer_steps"] = run.transfer_steps
        run.teacher = convert("identity", tensors, config_from_dict(smeta["config"]), cfg, xs, None).to(device())
        run.teacher.eval().requires_grad_(False)
    _start_or_resume(run, prior)
    return run


def _prior(d: Path, identity: dict, restart: bool | str, key: str) -> tuple[dict | None, bool]:
    """The checkpoint block KEY's run resumes (None: a fresh start), and whether it lies in the staging folder
    beside ``d``: zg repro over a finished or another run trains beside it, and an earlier attempt there (killed,
    or a Ray retry after its worker died) resumes from its last checkpoint instead of starting over."""
    prior = resumable(
        None if restart is True else checkpoint.read_meta(d),
        identity,
        where=f"models/blocks/{key}",
        fix="rerun with --restart to discard it, or restore the old params",
        auto=restart == "auto",
    )
    if prior is None and restart == "auto":
        beside = loop.staged(d, checkpoint.read_meta, lambda m: matches(m, identity))
        if beside is not None:
            return beside, True
    return prior, False


def _start_or_resume(run: Run, prior: dict | None) -> None:
    """A fresh run's init weights and checkpoint 0, or a resumed run's state (a finished one's weights checked)."""
    d = run.dir
    if prior is None:
        checkpoint.save_weights(run.block.weights(), d / "init.safetensors")
        checkpoint.save(d, run.meta, run.block, run.opt, run.gen, run.curve, 0)
    elif prior.get("done"):  # nothing to train: no checkpoint is read unless its metrics must be rebuilt
        checkpoint.check_weights(d, prior)
        run.finished, run.prior, run.step = True, prior, prior["step"]
    else:
        run.curve = checkpoint.restore(d, prior, run.block, run.opt, run.gen)
        run.step = prior["step"]


def _inputs(project: ProjectConfig, key: str, spec, cfg: TrainConfig, layout: Layout):
    """(teacher slice tensors, its metadata, the boundary pair or online targets) of block KEY, checked to agree:
    the slice covers the block's boundaries, and both come from one teacher."""
    tensors, smeta = load_slice(layout.teacher_slice(key))
    if (smeta.get("in"), smeta.get("out")) != (spec.input, spec.output):
        raise ZgError(
            f"teacher slice for {key} covers {smeta.get('in')}->{smeta.get('out')}, params say "
            f"{spec.input}->{spec.output}",
            fix="re-run `dvc repro teacher` after changing the partition",
        )
    src = open_targets(cfg.targets, layout, spec, project.partition, project.materialize)
    check(
        f"the boundaries of {key}",
        src.lineage,
        f"its teacher slice {layout.teacher_slice(key).name}",
        {"teacher_sha256": smeta.get("teacher_sha256")},
        keys=("teacher_sha256",),
        fix="pull or rebuild both from one commit (`dvc repro teacher materialize`)",
    )
    return tensors, smeta, src


def _identity(key: str, spec, seed: int, cfg: TrainConfig, fingerprints: dict, teacher_sha256: str) -> dict:
    """What makes a run this run: a checkpoint resumes only under the same identity."""
    return {
        "key": key,
        "in": spec.input,
        "out": spec.output,
        "seed": seed,
        "trainer_version": TRAINER_VERSION,
        "config": cfg.identity(),
        "fingerprints": fingerprints,
        "teacher_sha256": teacher_sha256,
    }


def _meta(identity: dict, smeta: dict, block, tensors: dict, steps: int) -> dict:
    """meta.json of a run: its identity, the teacher layers it came from and the converted block's shape."""
    return {
        **identity,
        "teacher_config": smeta["config"],
        "teacher_layers": smeta["layers"],
        "intermediate_sizes": block.intermediate_sizes,
        "windows": block.windows,
        **({"layer_types": block.layer_types} if block.layer_types is not None else {}),
        **({"kv_heads": block.kv_heads} if any(h is not None for h in block.kv_heads) else {}),
        **({"attention": block.attention} if any(a is not None for a in block.attention) else {}),
        **({"experts": block.experts} if any(e is not None for e in block.experts) else {}),
        **({"top_k": block.top_k} if any(k is not None for k in block.top_k) else {}),
        "params": sum(p.numel() for p in block.parameters()),
        **(
            {"active_params": active_params(block), "teacher_active_params": teacher_active(tensors, smeta["config"])}
            if block.family.moe is not None
            else {}
        ),
        "teacher_params": sum(v.numel() for v in tensors.values()),
        "steps": steps,
        "done": False,
        "state_sha256": None,
    }


@locked("block")
def train_block(
    project: ProjectConfig,
    key: str,
    *,
    targets: str | None = None,
    stop_after: int | None = None,
    restart: bool | str = False,
    layout: Layout = Layout(),
    on_step=None,
) -> BlockResult:
    """Train block KEY to train.steps (or ``stop_after`` more steps), checkpointing; resumes where it stopped."""
    loop.check_stop_after(stop_after)
    run = setup(project, key, targets=targets, restart=restart, layout=layout)
    if run.finished:
        recorded = _recorded_result(run, layout.block_metrics(key))
        if recorded is not None:  # a no-op rerun: reads no checkpoint, writes nothing
            return recorded
        run.curve = checkpoint.restore(run.dir, run.prior, run.block, run.opt, run.gen)  # rebuild the metrics
    run.on_step = on_step
    cfg, d = run.cfg, run.dir
    end = loop.end_step(cfg.steps, run.step, stop_after)
    fit(run, end)
    sha = checkpoint.state_sha256(run.block, run.opt)
    if end < cfg.steps:
        checkpoint.save(d, run.meta, run.block, run.opt, run.gen, run.curve, end)
        loop.publish(d, layout.block_dir(key))
        return BlockResult(
            key=key, status="stopped", step=end, steps=cfg.steps, state_sha256=sha, train_loss=loop.mean_tail(run.curve)
        )
    run.block.eval()
    heldout = _heldout(run.block, run.src, cfg)
    if not math.isfinite(heldout):  # weights the last steps made useless (finite, but far out): never "done"
        raise _diverged(key, d)(cfg.steps - 1, f"the held-out loss became {heldout}")
    run.meta.update(done=True, state_sha256=sha)
    if not run.finished:
        checkpoint.finish(d, run.meta, run.block, run.opt, run.gen, run.curve, cfg.steps)
        loop.publish(d, layout.block_dir(key))
    result = _done(run, key, heldout, sha)
    if run.finished:  # a no-op rerun: the recorded speed stands, and no file changes
        result.tokens_per_s = read_timings(layout.block_metrics(key)).get("tokens_per_s")
    write_metrics(layout.block_metrics(key), result.metrics())
    curve = "step,loss\n" + "".join(f"{i},{v:.6g}\n" for i, v in enumerate(run.curve))
    path = layout.block_loss_curve(key)
    if not path.exists() or path.read_text() != curve:
        write_text(path, curve)
    return result


def _recorded_result(run: Run, path: Path) -> BlockResult | None:
    """A finished run's result as its metrics file records it (with the speed set aside beside it), when that file
    belongs to this very run (its state_sha256); None when it must be rebuilt."""
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(m, dict) or m.get("state_sha256") != run.prior.get("state_sha256") or m.get("status") != "done":
        return None
    names = {f.name for f in fields(BlockResult)}
    try:
        result = BlockResult(
            **{k: v for k, v in m.items() if k in names}, kv={k: v for k, v in m.items() if k not in names}
        )
    except TypeError:  # a file of another shape: rebuilt from the checkpoint
        return None
    result.tokens_per_s = read_timings(path).get("tokens_per_s")
    return result if result.metrics() == {**m, "tokens_per_s": result.tokens_per_s} else None


def _done(run: Run, key: str, heldout: float, sha: str) -> BlockResult:
    """The result of a finished run: its losses, size, KV cache and identity."""
    cfg, meta = run.cfg, run.meta
    return BlockResult(
        key=key,
        steps=cfg.steps,
        train_loss=loop.mean_tail(run.curve),
        first_loss=run.curve[0] if run.curve else None,
        heldout_loss=heldout,
        tokens_per_s=run.tokens_per_s(),
        params=meta["params"],
        teacher_params=meta["teacher_params"],
        param_ratio=meta["params"] / meta["teacher_params"],
        kv=kv_summary(
            meta["teacher_config"],
            run.block.cache_windows(),
            len(meta["teacher_layers"]),
            run.block.cache_heads(),
            run.block.attention,
        ),
        experts={k: meta[k] for k in ("active_params", "teacher_active_params") if k in meta},
        objective=cfg.objective,
        conversion=cfg.conversion,
        targets=cfg.targets,
        state_sha256=sha,
        status="done",
        step=cfg.steps,
    )

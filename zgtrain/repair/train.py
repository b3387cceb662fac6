"""The optional repair stage: global distillation of the assembled student on the teacher's logits.

`zg train repair` (dvc stage `repair`, generated only when ``repair.steps > 0``) trains models/student
against the teacher's logits on the train split only, and writes models/repaired (a transformers folder
like models/student), metrics/repair.json and plots/loss/repair.csv.

- Targets: the head slice (final norm + LM head) applied to the last stored boundary
  (zgtrain/repair/model.py), computed on the fly per batch. No top-k cache: the full-vocabulary KL is
  exact (no truncation bias), costs one (B*T, C) x (C, V) matmul next to the student's own forward,
  and needs no extra dataset or lineage beyond the boundary's own, whose fingerprint the run records.
- Deterministic and resumable like block training: the same loop (zgtrain/fit/loop.py; this module
  passes in the batches and one step's distillation), resume check (zgtrain/fit/identity.py) and
  checkpoint format (zgtrain/fit/checkpoint.py: weights of what trains, AdamW state, every RNG state,
  loss curve), the data order a pure function of (seed, step) (zgdata/reader.step_rows),
  ``state_sha256`` at the end. models/repair holds meta.json + the last ckpt-NNNNNN; a killed run
  resumes from it. Where its files go: ``Layout.repair`` (``Layout.search_repair`` for the search's).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from zgdata.core.atomic import atomic_path, write_json, write_text
from zgdata.core.lock import project_lock
from zgdata.core.metrics_file import write_metrics
from zgdata.core.runtime import device, seed_all, set_threads
from zgdata.errors import ZgError
from zgdata.layout import Layout, RepairPaths
from zgdata.lineage import check, read_tokens_json
from zgdata.store.reader import BoundaryDataset, check_batch, step_rows
from zgdata.teacher.prepare import load_slice
from zgdata.tokens.store import open_tokens
from zgtrain.fit import checkpoint, loop
from zgtrain.fit.identity import resumable
from zgtrain.fit.rerun import rerun_of
from zgtrain.fit.schedule import block_seed, lr_at
from zgtrain.project.config import ProjectConfig
from zgtrain.project.sections import RepairConfig
from zgtrain.repair.model import RepairModel, TeacherHead, distill_loss, token_kl
from zgtrain.student.card import write_repaired_card
from zgtrain.student.load import CHECKSUMS, load_student, record_checksums, student_sha256

__all__ = ["repair", "setup", "fit", "RepairRun", "RepairData", "RepairResult", "REPAIR_VERSION"]

REPAIR_VERSION = 1


def _afresh(d: Path) -> str:
    """Start the repair in run folder ``d`` over: `zg train repair --restart`, or the search repair's own command."""
    return f"rerun with `{rerun_of(d).restart}` to start the repair afresh"


class RepairData:
    """Train/held-out token rows and the last boundary (the teacher's logits before its head), row-aligned."""

    def __init__(self, layout: Layout, boundary: str):
        self.tokens = open_tokens(layout)
        self.boundary = BoundaryDataset(layout.boundary(boundary))
        lineage = self.boundary.meta.get("lineage", {})
        check(
            str(layout.tokens_json),
            {"tokens_fingerprint": read_tokens_json(layout)["fingerprint"]},
            str(layout.boundary(boundary)),
            lineage,
            keys=("tokens_fingerprint",),
            fix="rebuild both from one commit (`dvc repro tokens materialize`)",
        )
        seq = self.tokens.to_table(columns=["seq_id"]).column("seq_id").to_numpy()
        if not np.array_equal(seq, self.boundary.seq_ids):
            raise ZgError(
                f"{layout.boundary(boundary)} is not row-aligned with {layout.tokens}",
                fix="re-run `dvc repro materialize` after tokens",
            )
        self.has_length = "length" in self.tokens.schema.names  # corpus.packing: pad

    def rows(self, split: str) -> np.ndarray:
        return self.boundary.rows(split)

    def take(self, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids (B, T) int64, mask (B, T) bool: real tokens, last boundary (B, T, C) in its storage dtype)."""
        rows = np.asarray(rows, dtype=np.int64)
        table = self.tokens.take(rows, columns=["input_ids"] + (["length"] if self.has_length else []))
        col = table.column("input_ids").combine_chunks()
        ids = torch.from_numpy(col.values.to_numpy().astype(np.int64)).reshape(len(rows), -1)
        mask = torch.ones_like(ids, dtype=torch.bool)
        if self.has_length:
            length = torch.from_numpy(table.column("length").to_numpy().astype(np.int64))
            mask = torch.arange(ids.shape[1]).unsqueeze(0) < length.unsqueeze(1)
        return ids, mask, self.boundary.take(rows)


@dataclass(kw_only=True)
class RepairRun(loop.RunState):
    cfg: RepairConfig
    paths: RepairPaths
    meta: dict
    model: RepairModel
    head: TeacherHead
    opt: torch.optim.Optimizer
    gen: torch.Generator
    data: RepairData
    seed: int
    student: Path  # the folder it started from: its tokenizer, zerograph.json and modeling file are copied
    curve: list = field(default_factory=list)


@dataclass(kw_only=True)
class RepairResult(loop.Result):
    """What ``repair`` returns; ``metrics()`` is metrics/repair.json (a stopped run: its STOPPED keys)."""

    STOPPED = ("status", "step", "steps", "state_sha256", "train_loss")
    status: str
    step: int
    steps: int
    state_sha256: str
    kl_train_before: float | None = None
    kl_train_after: float | None = None
    kl_heldout_before: float | None = None
    kl_heldout_after: float | None = None
    eval_rows: int | None = None
    first_loss: float | None = None
    train_loss: float | None
    trainable: str | None = None
    trainable_params: int | None = None
    params: int | None = None
    temperature: float | None = None
    ce_weight: float | None = None
    tokens_per_s: float | None = None
    student_sha256: str | None = None
    targets: str = "head slice on the last boundary, on the fly"


@torch.no_grad()
def mean_kl(model: RepairModel, head: TeacherHead, data: RepairData, rows: np.ndarray, batch_size: int) -> float | None:
    """Mean KL(teacher || student) at T=1 per real position over ``rows`` (None without rows)."""
    if len(rows) == 0:
        return None
    dev = device()
    total = count = 0.0
    for i in range(0, len(rows), batch_size):
        ids, mask, h = data.take(rows[i : i + batch_size])
        kl = token_kl(model(ids.to(dev)), head(h.to(dev)))
        total += float((kl.double() * mask.to(dev)).sum())
        count += float(mask.sum())
    return total / max(count, 1.0)


def _kls(model: RepairModel, head: TeacherHead, data: RepairData, cfg: RepairConfig) -> dict:
    """KL at T=1 on the first ``repair.eval_rows`` train and held-out sequences (held-out: reported, never trained)."""
    return {
        split: mean_kl(model, head, data, data.rows(split)[: cfg.eval_rows], cfg.batch_size)
        for split in ("train", "heldout")
    }


def _inputs(project: ProjectConfig, layout: Layout) -> tuple[RepairData, dict, dict]:
    """The data and the teacher's head slice, checked against each other: (data, head tensors, head meta)."""
    last = project.partition.names[-1]
    head_tensors, hmeta = load_slice(layout.teacher_head)
    data = RepairData(layout, last)
    lineage = data.boundary.meta.get("lineage", {})
    check(
        str(layout.boundary(last)),
        lineage,
        str(layout.teacher_head),
        {"teacher_sha256": hmeta.get("teacher_sha256")},
        keys=("teacher_sha256",),
        fix="pull or rebuild both from one commit (`dvc repro teacher materialize`)",
    )
    n_layers = int(hmeta["config"]["num_hidden_layers"])
    if lineage.get("layer") != n_layers:
        raise ZgError(
            f"repair needs the teacher's last boundary (layer {n_layers}); partition.boundaries ends at "
            f"{lineage.get('layer')}",
            key="partition.boundaries",
            fix=f"end partition.boundaries with {n_layers}, or set repair.steps: 0",
        )
    if not len(data.rows("train")):
        raise ZgError(f"{layout.boundary(last)} has no 'train' rows", fix="check corpus.heldout and the caps")
    return data, head_tensors, hmeta


def _enabled(project: ProjectConfig):
    """The repair section, refused in one line where repair is off."""
    if not project.repair.enabled:
        raise ZgError(
            "repair.steps is 0: the repair stage is off",
            key="repair.steps",
            fix="set repair.steps > 0 in params.yaml and run `zg pipeline`",
        )
    return project.repair


def setup(
    project: ProjectConfig,
    *,
    restart: bool = False,
    layout: Layout = Layout(),
    student: Path | None = None,
    paths: RepairPaths | None = None,
) -> RepairRun:
    """Build the repair run: a fresh start (checkpoint 0, KL before measured) or a resume from its run folder.

    ``student`` and ``paths`` default to the main pipeline's (models/student, ``layout.repair``); the search
    repair (zgtrain/search/repair.py) passes models/search/student and ``layout.search_repair``."""
    cfg = _enabled(project)
    set_threads(cfg.threads)
    paths = paths or layout.repair
    student = Path(student or layout.student)
    data, head_tensors, hmeta = _inputs(project, layout)
    check_batch(cfg.batch_size, len(data.rows("train")), "repair.batch_size")
    student_sha = student_sha256(student)
    lm = load_student(student)
    seed = block_seed(project.seed, cfg.seed, "repair")
    identity = {
        "repair_version": REPAIR_VERSION,
        "seed": seed,
        "config": cfg.identity(),
        "student_sha256": student_sha,
        "boundary": {project.partition.names[-1]: data.boundary.fingerprint},
        "teacher_sha256": hmeta["teacher_sha256"],
    }
    d = paths.run_dir
    prior = resumable(None if restart else checkpoint.read_meta(d), identity, where=str(d), fix=_afresh(d))
    gen = seed_all(seed)
    dev = device()
    head = TeacherHead(head_tensors, lm).to(dev)
    n_params = sum(p.numel() for p in lm.parameters())  # the student's own, adapters left out
    model = RepairModel(lm, cfg.trainable, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, gen=gen).to(dev)
    opt = torch.optim.AdamW(model.trainable(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    d = loop.begin(d, prior)  # only now, when nothing can refuse the run; a restart builds beside the old folder
    meta = {
        **identity,
        "steps": cfg.steps,
        "done": False,
        "state_sha256": None,
        "trainable_params": sum(p.numel() for p in model.trainable()),
        "params": n_params,
    }
    run = RepairRun(
        cfg=cfg,
        paths=replace(paths, run_dir=d),
        meta=meta,
        model=model,
        head=head,
        opt=opt,
        gen=gen,
        data=data,
        seed=seed,
        student=student,
    )
    _start_or_resume(run, prior)
    return run


def _start_or_resume(run: RepairRun, prior: dict | None) -> None:
    """A fresh run's checkpoint 0 (with the KL it starts from), or a resumed run's state from its checkpoint."""
    d, meta = run.paths.run_dir, run.meta
    if prior is None:
        # what repair starts from, measured once: a resumed run's model has already moved
        meta["kl_before"] = _kls(run.model, run.head, run.data, run.cfg)
        checkpoint.save(d, meta, run.model, run.opt, run.gen, run.curve, 0)
    else:
        meta["kl_before"] = prior.get("kl_before")
        try:
            run.curve = checkpoint.restore(d, prior, run.model, run.opt, run.gen)
        except ZgError as e:
            raise ZgError(e.what, fix=_afresh(d)) from e
        run.step = prior["step"]


def _steps(run: RepairRun) -> loop.Steps:
    """Repair's part of the loop: seeded train rows, the distillation loss against the head slice's logits."""
    cfg, model, opt, d = run.cfg, run.model, run.opt, run.paths.run_dir
    dev = device()
    train_rows = run.data.rows("train")

    def fail(step: int, what: str) -> ZgError:
        return loop.diverged(
            "repair",
            step,
            what,
            key="repair.lr",
            good=checkpoint.read_meta(d)["step"],
            fix=f"lower repair.lr and rerun with `{rerun_of(d).restart}`",
        )

    def work(step: int, rows) -> int:
        ids, mask, h = run.data.take(rows)
        ids, mask = ids.to(dev), mask.to(dev)
        loss = distill_loss(
            model(ids), run.head(h.to(dev)), ids, mask, temperature=cfg.temperature, ce_weight=cfg.ce_weight
        )
        loop.update(loss, model.trainable(), opt, cfg.grad_clip, lambda what: fail(step, what))
        run.curve.append(float(loss.detach()))
        return int(mask.sum())

    return loop.Steps(
        name="repair",
        work=work,
        lrs=[(opt, lambda s: lr_at(cfg, s))],
        batches=lambda start, end: ((s, step_rows(train_rows, s, cfg.batch_size, run.seed)) for s in range(start, end)),
        save=lambda step: checkpoint.save(d, run.meta, model, opt, run.gen, run.curve, step),
        checkpoint_every=cfg.checkpoint_every,
        fail=fail,
    )


def fit(run: RepairRun, end: int) -> None:
    """Optimizer steps [run.step, end) on train rows only: the only place the repaired weights change."""
    loop.fit(run, end, _steps(run))


def _publish(run: RepairRun, summary: dict) -> None:
    """paths.model (models/repaired): the student folder with the repaired weights (float32, the precision they
    trained in)."""
    src = run.student
    run.model.merge_adapters()  # trainable lora: fold the adapters in (after state_sha256 and the checkpoint)
    with atomic_path(run.paths.model) as tmp:
        run.model.lm.save_pretrained(tmp)
        for p in sorted(src.iterdir()):  # tokenizer, zerograph.json, zg's pinned modeling file: as the student's
            if p.is_file() and not (
                p.suffix == ".safetensors"
                or p.name in ("config.json", "generation_config.json", CHECKSUMS)
                or p.name.endswith(".safetensors.index.json")
            ):
                shutil.copyfile(p, tmp / p.name)
        zg = _read_json(tmp / "zerograph.json", src)
        zg["repair"] = summary
        write_json(tmp / "zerograph.json", zg)
        write_repaired_card(tmp, summary)  # the student's card, copied above, becomes the repaired model's
        record_checksums(tmp)  # the repaired weights' digests, checked by load_student


def _read_json(path: Path, student: Path) -> dict:
    """A JSON file copied from ``student`` (the folder the repair started from, named in the advice)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ZgError(
            f"{path} is unreadable ({e})", fix=f"rebuild the student with `dvc repro -f {rerun_of(student).stage}`"
        ) from e


def repair(
    project: ProjectConfig,
    *,
    stop_after: int | None = None,
    restart: bool = False,
    layout: Layout = Layout(),
    student: Path | None = None,
    paths: RepairPaths | None = None,
) -> RepairResult:
    """Run (or resume) the repair to repair.steps (or ``stop_after`` more steps), then publish models/repaired
    (``student`` and ``paths``: as in ``setup``)."""
    paths = paths or layout.repair
    loop.check_stop_after(stop_after)
    with project_lock(layout, paths.lock, writes=paths.run_dir, errors_at=paths.run_dir.parent):
        return _repair(project, stop_after=stop_after, restart=restart, layout=layout, paths=paths, student=student)


def _repair(project, *, stop_after, restart, layout, paths, student) -> RepairResult:
    run = setup(project, restart=restart, layout=layout, student=student, paths=paths)
    cfg = run.cfg
    end = loop.end_step(cfg.steps, run.step, stop_after)
    fit(run, end)
    sha = checkpoint.state_sha256(run.model, run.opt)
    if end < cfg.steps:
        checkpoint.save(run.paths.run_dir, run.meta, run.model, run.opt, run.gen, run.curve, end)
        loop.publish(run.paths.run_dir, paths.run_dir)
        return RepairResult(
            status="stopped", step=end, steps=cfg.steps, state_sha256=sha, train_loss=loop.mean_tail(run.curve)
        )
    after = _kls(run.model, run.head, run.data, cfg)
    before = run.meta["kl_before"]
    run.meta.update(done=True, state_sha256=sha)
    checkpoint.finish(run.paths.run_dir, run.meta, run.model, run.opt, run.gen, run.curve, cfg.steps)
    loop.publish(run.paths.run_dir, paths.run_dir)
    run.paths = paths
    result = RepairResult(
        status="done",
        step=cfg.steps,
        steps=cfg.steps,
        state_sha256=sha,
        kl_train_before=before["train"],
        kl_train_after=after["train"],
        kl_heldout_before=before["heldout"],
        kl_heldout_after=after["heldout"],
        eval_rows=cfg.eval_rows,
        first_loss=run.curve[0] if run.curve else None,
        train_loss=loop.mean_tail(run.curve),
        trainable=cfg.trainable,
        trainable_params=run.meta["trainable_params"],
        params=run.meta["params"],
        temperature=cfg.temperature,
        ce_weight=cfg.ce_weight,
        tokens_per_s=run.tokens_per_s(),
        student_sha256=run.meta["student_sha256"],
    )
    metrics = result.metrics()
    _publish(
        run,
        {k: metrics[k] for k in ("steps", "state_sha256", "student_sha256", "trainable", "temperature", "ce_weight")},
    )
    write_metrics(paths.metrics, metrics)
    write_text(paths.loss_curve, "step,loss\n" + "".join(f"{i},{v:.6g}\n" for i, v in enumerate(run.curve)))
    return result

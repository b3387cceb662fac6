"""Evaluate the assembled student against the teacher on the held-out split, with gates."""

from __future__ import annotations

import csv
import io
import time

import numpy as np
import torch

from zgdata.atomic import atomic_path, write_json, write_text
from zgdata.config import PartitionConfig
from zgdata.errors import ZgError
from zgdata.families import family_of
from zgdata.layout import Layout
from zgdata.lock import locked
from zgdata.progress import stderr
from zgdata.reader import BoundaryDataset
from zgdata.runtime import device
from zgdata.teacher import load_slice, load_teacher
from zgdata.tokens import open_tokens, read_tokens
from zgtrain.assemble import build_student
from zgtrain.checkpoint import load_block
from zgtrain.config import GatesConfig, ProjectConfig
from zgtrain.metrics import context_targets, token_nll, window_nll
from zgtrain.objectives import nmse
from zgtrain.repair_eval import add_repaired, repaired_loader
from zgtrain.student import load_student

__all__ = ["evaluate", "gate_verdicts"]


def gate_verdicts(gates: GatesConfig, ce_gap: float, retention: float) -> dict:
    checks = {"max_ce_gap": (ce_gap, ce_gap <= gates.max_ce_gap, gates.max_ce_gap),
              "min_context_retention": (retention, retention >= gates.min_context_retention, gates.min_context_retention)}
    out = {k: {"passed": bool(ok), "value": v, "threshold": t} for k, (v, ok, t) in checks.items()}
    out["all"] = all(v["passed"] for v in out.values())
    return out


def _model_scores(model, ids, targets, cfg: EvalConfig) -> dict:
    nll = token_nll(model, ids, cfg.batch_size)                          # (N, T-1)
    full = nll[targets[:, 0], targets[:, 1] - 1]                         # target p predicted at p-1
    win = window_nll(model, ids, targets, window=cfg.window, batch_size=cfg.batch_size)
    return {"ce": float(nll.mean()), "context_use": float((win - full).mean())}


def _shift(part: PartitionConfig, layout: Layout, rows: np.ndarray) -> dict:
    """Per block: normalized error fed teacher boundary k vs fed the assembled student's own upstream output."""
    head, hmeta = load_slice(layout.teacher_head)
    ids, _ = read_tokens(layout, rows)
    dev = device()
    fam = family_of(hmeta["config"])  # GPT-2 adds learned positions to the token embeddings
    h = fam.embed_head({k: v.float() for k, v in head.items()}, ids).to(dev)   # (N, T, C) student upstream
    out = {}
    with torch.no_grad():
        for spec in part.blocks():
            block, _ = load_block(layout, spec.key)
            block = block.to(dev)
            x = BoundaryDataset(layout.boundary(spec.input)).take(rows).float().to(dev)
            y = BoundaryDataset(layout.boundary(spec.output)).take(rows).float().to(dev)
            e_t, d = nmse(block(x), y)
            h = block(h)
            e_s, _ = nmse(h, y)
            out[spec.key] = {"teacher_input": e_t / d, "student_input": e_s / d}
    return out


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _plots(layout: Layout, scores: dict, shift: dict, part: PartitionConfig) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = layout.eval_plots
    write_text(d / "ce.csv", _csv([["model", "ce"]] + [[n, f"{scores[n]['ce']:.6f}"]
                                                       for n in ("teacher", "untrained", "student")]))
    write_text(d / "shift.csv", _csv([["block", "teacher_input", "student_input"]]
                                     + [[k, f"{v['teacher_input']:.6f}", f"{v['student_input']:.6f}"]
                                        for k, v in shift.items()]))
    with atomic_path(d / "png") as png:  # a DVC directory output: its images are replaced together
        png.mkdir(parents=True)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(["teacher", "untrained", "student"], [scores[n]["ce"] for n in ("teacher", "untrained", "student")])
        ax.set_ylabel("held-out CE (nats/token)")
        fig.tight_layout(); fig.savefig(png / "ce.png", dpi=100); plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        keys = list(shift)
        xs = np.arange(len(keys))
        ax.bar(xs - 0.2, [shift[k]["teacher_input"] for k in keys], 0.4, label="teacher input")
        ax.bar(xs + 0.2, [shift[k]["student_input"] for k in keys], 0.4, label="student input")
        ax.set_xticks(xs, keys); ax.set_ylabel("normalized error"); ax.legend()
        fig.tight_layout(); fig.savefig(png / "shift.png", dpi=100); plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for spec in part.blocks():
            p = layout.block_loss_curve(spec.key)
            if p.exists():
                rows = list(csv.DictReader(open(p)))
                ax.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], label=spec.key)
        ax.set_yscale("log"); ax.set_xlabel("step"); ax.set_ylabel("train loss"); ax.legend()
        fig.tight_layout(); fig.savefig(png / "loss.png", dpi=100); plt.close(fig)


@locked("evaluate")
def evaluate(project: ProjectConfig, *, layout: Layout = Layout()) -> dict:
    t0 = time.perf_counter()
    cfg, gates, part = project.eval, project.gates, project.partition
    tokens = open_tokens(layout)
    splits = np.asarray(tokens.to_table(columns=["split"]).column("split").to_pylist())
    rows = np.flatnonzero(splits == "heldout")
    if cfg.heldout_seqs:
        rows = rows[: cfg.heldout_seqs]
    ids, _ = read_tokens(layout, rows, ds=tokens)
    if cfg.context_min_pos >= ids.shape[1]:
        raise ZgError(f"eval.context_min_pos {cfg.context_min_pos} is not below seq_len {ids.shape[1]}",
                      key="eval.context_min_pos", fix=f"use a value below {ids.shape[1]}")
    targets = context_targets(len(ids), ids.shape[1], k=cfg.context_targets, min_pos=cfg.context_min_pos, seed=cfg.seed)
    if not (layout.student / "config.json").exists():
        raise ZgError(f"{layout.student} not found", fix="run `dvc repro assemble`")
    models = {"teacher": lambda: load_teacher(layout, with_tokenizer=False)[0],
              "untrained": lambda: build_student(project, layout=layout, which="init")[0],
              "student": lambda: load_student(layout.student)}
    if project.repair.enabled:  # issue 15: also score models/repaired; the gates judge it (zgtrain/repair_eval.py)
        models["repaired"] = repaired_loader(layout)
    scores = {}
    for name, load in models.items():
        stderr.print(f"evaluate: {name} ({len(ids)} sequences, {len(targets)} context targets)")
        scores[name] = _model_scores(load().to(device()), ids, targets, cfg)
    shift = _shift(part, layout, rows)
    t, u, s = scores["teacher"], scores["untrained"], scores["student"]
    ce_gap = s["ce"] - t["ce"]
    retention = s["context_use"] / t["context_use"] if t["context_use"] else float("nan")
    denom = u["ce"] - t["ce"]
    result = {"teacher_ce": t["ce"], "student_ce": s["ce"], "untrained_ce": u["ce"], "ce_gap": ce_gap,
              "ce_recovered": (u["ce"] - s["ce"]) / denom if denom else float("nan"),
              "teacher_context_use": t["context_use"], "student_context_use": s["context_use"],
              "untrained_context_use": u["context_use"], "context_retention": retention,
              "shift": shift, "gates_passed": gate_verdicts(gates, ce_gap, retention),
              "heldout_sequences": int(len(ids)), "heldout_tokens": int(ids.numel()),
              "context_window": cfg.window, "context_targets": int(len(targets)),
              "seconds": time.perf_counter() - t0}
    if project.repair.enabled:
        add_repaired(result, scores, gate_verdicts, gates)
    _plots(layout, scores, shift, part)
    write_json(layout.eval_metrics, result)
    return result

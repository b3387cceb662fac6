"""Evaluate the assembled student against the teacher on every evaluation set, with gates.

The sets are the in-domain held-out split plus ``eval.sets`` (zgtrain/evaluate/sets.py). Each
model is loaded once and scored on every set (zgtrain/evaluate/set_metrics.py); the teacher and the
student also continue a few held-out prompts (zgtrain/evaluate/generation.py). metrics/eval.json keeps
the in-domain figures at the top level and every set's figures,
intervals and lineage under ``sets``; ``gates_passed`` holds each set's verdict and ``all``,
the verdict over the sets ``gates.sets`` names.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, fields

import numpy as np
import torch

from zgdata.config import PartitionConfig
from zgdata.core.atomic import atomic_path, write_text
from zgdata.core.lock import locked
from zgdata.core.metrics_file import write_metrics
from zgdata.core.progress import stderr
from zgdata.core.runtime import device
from zgdata.errors import ZgError
from zgdata.families.registry import family_of
from zgdata.families.widen import running_widened
from zgdata.layout import Layout
from zgdata.materialize.virtual import open_pair_in
from zgdata.teacher.prepare import load_slice, load_teacher
from zgdata.tokens.store import read_tokens
from zgtrain.block.load import load_block
from zgtrain.block.objectives import squared_error
from zgtrain.evaluate.gates import judge_sets
from zgtrain.evaluate.generation import greedy, matching_prefix, prompts, report
from zgtrain.evaluate.repaired import add_repaired, repaired_loader
from zgtrain.evaluate.set_metrics import figures, score, targets_for
from zgtrain.evaluate.sets import heldout_set, tokenize_set
from zgtrain.project.config import ProjectConfig
from zgtrain.project.eval_sets import HELDOUT
from zgtrain.student.assemble import build_student
from zgtrain.student.card import write_eval_card
from zgtrain.student.load import load_student

__all__ = ["evaluate", "eval_sets", "EvalResult"]


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """What `zg train evaluate` measured; ``metrics()`` is metrics/eval.json. The figures up to
    ``top1_agreement`` are the in-domain held-out set's (zgtrain/evaluate/set_metrics.py ``figures``)."""

    teacher_ce: float
    student_ce: float
    untrained_ce: float
    ce_gap: float
    """student_ce - teacher_ce."""
    ce_gap_ci95: dict
    ce_recovered: float
    teacher_context_use: float
    student_context_use: float
    untrained_context_use: float
    context_retention: float
    context_retention_ci95: dict
    top1_agreement: float
    shift: dict
    """Per block: normalized error fed teacher boundary k vs fed the assembled student's own upstream output."""
    gates_passed: dict
    """The gated model's verdicts (zgtrain/evaluate/gates.py ``judge_sets``): per set and ``all``."""
    heldout_sequences: int
    heldout_tokens: int
    context_window: int
    context_targets: int
    sets: dict
    """Every eval set's figures, intervals and lineage, the held-out split first."""
    size: dict
    """The student's parameters and KV-cache bytes per token against the teacher's."""
    generation: dict | None = None
    """Greedy continuations of held-out prompts: how many tokens the student matches the teacher (None: none asked)."""
    repaired: dict | None = None
    """With repair on: the repaired model's figures (zgtrain/evaluate/repaired.py); ``gates_passed`` then judges it."""
    student_gates_passed: dict | None = None
    """With repair on: the student's own verdicts."""
    gated_model: str | None = None
    """With repair on: "repaired"."""
    seconds: float

    def metrics(self) -> dict:
        """metrics/eval.json: every field, less the optional ones that are None."""
        optional = ("generation", "repaired", "student_gates_passed", "gated_model")
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in optional or getattr(self, f.name) is not None
        }


def _shift(part: PartitionConfig, layout: Layout, rows: np.ndarray, mcfg, batch: int) -> dict:
    """Per block: normalized error fed teacher boundary k vs fed the assembled student's own upstream output.

    ``nmse``'s two sums over every held-out token, taken ``batch`` rows at a time: one block and one batch of rows
    on the device at once (an 8B teacher's 256 held-out rows of 2,048 tokens would not fit whole), the student's
    upstream kept on the CPU between blocks; the normalizer's per-dimension mean is the whole set's."""
    head, hmeta = load_slice(layout.teacher_head)
    ids, _ = read_tokens(layout, rows)
    dev = device()
    fam = family_of(hmeta["config"])  # GPT-2 adds learned positions to the token embeddings
    h = fam.embed_head({k: v.float() for k, v in head.items()}, ids)  # (N, T, C) student upstream, on the CPU
    cuts = [slice(i, i + batch) for i in range(0, len(rows), batch)]
    out = {}
    with torch.no_grad():
        for spec in part.blocks():
            block, _ = load_block(layout, spec.key)
            block = block.to(dev)
            # h00 may be virtual (materialize.virtual_first: zgdata/materialize/virtual.py)
            x_ds, y_ds = open_pair_in(layout, spec, part, mcfg)
            mean = sum(y_ds.take(rows[c]).to(dev).double().sum((0, 1)) for c in cuts) / h.shape[0] / h.shape[1]
            e_t = e_s = d = 0.0
            for c in cuts:
                y = y_ds.take(rows[c]).float().to(dev)
                e_t += squared_error(block(x_ds.take(rows[c]).float().to(dev)), y)
                h_c = block(h[c].to(dev))
                h[c] = h_c.cpu()
                e_s += squared_error(h_c, y)
                d += float((y.double() - mean).pow(2).sum())
            out[spec.key] = {"teacher_input": e_t / d, "student_input": e_s / d}
    return out


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


SET_COLUMNS = (
    "ce_tokens",
    "teacher_ce",
    "student_ce",
    "untrained_ce",
    "ce_gap",
    "ce_recovered",
    "context_retention",
    "top1_agreement",
)


def _sets_csv(figs: dict, repaired: dict) -> str:
    """One row per eval set; with repair on, the repaired model's CE and gap as two more columns."""
    head = ["set", *SET_COLUMNS, "ce_gap_lo", "ce_gap_hi", "context_retention_lo", "context_retention_hi"]
    head += ["repaired_ce", "repaired_ce_gap"] if repaired else []
    rows = [
        [
            name,
            *[f"{f[c]:.6f}" if isinstance(f[c], float) else f[c] for c in SET_COLUMNS],
            *[f"{f[k][e]:.6f}" for k in ("ce_gap_ci95", "context_retention_ci95") for e in ("lo", "hi")],
            *([f"{repaired[name]['ce']:.6f}", f"{repaired[name]['ce_gap']:.6f}"] if repaired else []),
        ]
        for name, f in figs.items()
    ]
    return _csv([head] + rows)


def _plots(layout: Layout, scores: dict, shift: dict, part: PartitionConfig, figs: dict, repaired: dict) -> None:
    """CSVs for `dvc plots` and PNGs: CE per set (teacher, untrained, student and, with repair on, repaired),
    boundary shift per block, every block's train loss. ``repaired``: set -> the repaired model's figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_text(layout.eval_ce_plot, _csv([["model", "ce"]] + [[n, f"{scores[n]['ce']:.6f}"] for n in scores]))
    write_text(layout.eval_sets_plot, _sets_csv(figs, repaired))
    write_text(
        layout.eval_shift_plot,
        _csv(
            [["block", "teacher_input", "student_input"]]
            + [[k, f"{v['teacher_input']:.6f}", f"{v['student_input']:.6f}"] for k, v in shift.items()]
        ),
    )
    with atomic_path(layout.eval_figures) as png:  # a DVC directory output: its images are replaced together
        png.mkdir(parents=True)
        fig, ax = plt.subplots(figsize=(max(5, 2 * len(figs)), 3.5))
        xs = np.arange(len(figs))
        bars = {m: [f[f"{m}_ce"] for f in figs.values()] for m in ("teacher", "untrained", "student")}
        if repaired:
            bars["repaired"] = [repaired[name]["ce"] for name in figs]
        w = 0.8 / len(bars)
        for j, (m, ys) in enumerate(bars.items()):
            ax.bar(xs + (j - (len(bars) - 1) / 2) * w, ys, w, label=m)
        ax.set_xticks(xs, list(figs))
        ax.set_ylabel("CE (nats/token)")
        ax.legend(ncol=len(bars), fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0))  # above the bars
        fig.tight_layout()
        fig.savefig(png / "ce.png", dpi=100)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        keys = list(shift)
        xs = np.arange(len(keys))
        ax.bar(xs - 0.2, [shift[k]["teacher_input"] for k in keys], 0.4, label="teacher input")
        ax.bar(xs + 0.2, [shift[k]["student_input"] for k in keys], 0.4, label="student input")
        ax.set_xticks(xs, keys)
        ax.set_ylabel("normalized error")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png / "shift.png", dpi=100)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for spec in part.blocks():
            p = layout.block_loss_curve(spec.key)
            if p.exists():
                rows = list(csv.DictReader(open(p)))
                ax.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], label=spec.key)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png / "loss.png", dpi=100)
        plt.close(fig)


def _size(layout: Layout) -> dict:
    """The student's parameters and KV-cache bytes per token (zgtrain/block/kv_cache.py) against the teacher's, as
    assemble recorded them in zerograph.json (None where a student assembled before KV figures lacks them)."""
    summary = json.loads((layout.student / "zerograph.json").read_text())
    return {
        k: summary.get(k)
        for k in (
            "params",
            "teacher_params",
            "param_ratio",
            "kv_context",
            "kv_bytes_per_token",
            "teacher_kv_bytes_per_token",
            "kv_ratio",
        )
    }


def eval_sets(project: ProjectConfig, layout: Layout, held, tok) -> list:
    """The in-domain held-out set ``held`` and every eval.sets entry, tokenized with the teacher's tokenizer."""
    from zgdata.teacher.prepare import read_teacher_json

    specs = project.eval.set_specs()
    if not specs:
        return [held]
    teacher = read_teacher_json(layout)
    tok_sha, max_pos = teacher["tokenizer_sha256"], teacher["architecture"]["max_positions"]
    base = held.ids.shape[1]  # corpus.seq_len
    for i, spec in enumerate(specs):  # before any set is read: a long-context set the teacher cannot take
        if spec.seq_len > max_pos:
            raise ZgError(
                f"eval.sets[{i}].seq_len {spec.seq_len} (set '{spec.name}') exceeds the teacher's maximum "
                f"positions ({max_pos})",
                key=f"eval.sets[{i}].seq_len",
                fix=f"use seq_len <= {max_pos}",
            )
    extra = []
    for i, spec in enumerate(specs):
        seq_len = spec.seq_len or base
        stderr.print(f"evaluate: tokenizing eval set '{spec.name}' ({spec.source}, rows of {seq_len} tokens)")
        extra.append(
            tokenize_set(
                spec,
                i,
                tok=tok,
                tokenizer_sha256=tok_sha,
                seq_len=seq_len,
                seed=project.eval.seed,
                layout=layout,
                corpus=project.corpus,
                # about eval.batch_size rows of corpus.seq_len per forward pass, whatever the set's row length
                batch_size=0 if seq_len <= base else max(1, project.eval.batch_size * base // seq_len),
            )
        )
    return [held, *extra]


_HEADLINE = (
    "teacher_ce",
    "student_ce",
    "untrained_ce",
    "ce_gap",
    "ce_gap_ci95",
    "ce_recovered",
    "teacher_context_use",
    "student_context_use",
    "untrained_context_use",
    "context_retention",
    "context_retention_ci95",
    "top1_agreement",
)
"""The in-domain (held-out split) figures that metrics/eval.json keeps at its top level."""


def _models(project: ProjectConfig, layout: Layout) -> dict:
    """Loaders of the models evaluate scores, in scoring order: teacher, untrained, student (and repaired)."""
    # a teacher stored narrower than fp32 stays so and is widened one piece at a time (zgdata.families.widen)
    models = {
        "teacher": lambda: load_teacher(layout, with_tokenizer=False, per_layer=True)[0],
        "untrained": lambda: build_student(project, layout=layout, which="init")[0],
        "student": lambda: load_student(layout.student),
    }
    if project.repair.enabled:  # also score models/repaired; the gates judge it (zgtrain/evaluate/repaired.py)
        models["repaired"] = repaired_loader(layout)
    return models


def _score_models(models: dict, sets: list, targets: dict, cfg, gen_prompt, gen_rows) -> tuple[dict, dict]:
    """(scores[set][model], continuations[model]): each model loaded once, scored on every set, and (but the
    untrained one) continuing the held-out prompts."""
    scores: dict = {s.name: {} for s in sets}
    continuations = {}
    for name, load in models.items():
        model = load().to(device())
        with running_widened(model):
            for s in sets:
                scores[s.name][name] = score(model, name, s, targets[s.name], cfg)
            if name != "untrained" and gen_rows:
                continuations[name] = greedy(model, gen_prompt, cfg.generate_tokens)
        del model
    return scores, continuations


def _generation(result: dict, tok, gen_rows, gen_prompt, continuations: dict, cfg) -> str:
    """Add the continuations' agreement to ``result`` (``generation``) and return the report's text."""
    if not gen_rows:
        return report(tok, [], gen_prompt, gen_prompt, gen_prompt, HELDOUT)
    same = matching_prefix(continuations["teacher"], continuations["student"])
    result["generation"] = {
        "prompts": len(gen_rows),
        "prompt_tokens": cfg.prompt_tokens,
        "new_tokens": cfg.generate_tokens,
        "matching_prefix_mean": float(np.mean(same)),
    }
    if "repaired" in continuations:
        result["generation"]["repaired_matching_prefix_mean"] = float(
            np.mean(matching_prefix(continuations["teacher"], continuations["repaired"]))
        )
    return report(
        tok,
        gen_rows,
        gen_prompt,
        continuations["teacher"],
        continuations["student"],
        HELDOUT,
        repaired=continuations.get("repaired"),
    )


@locked("evaluate")
def evaluate(project: ProjectConfig, *, layout: Layout = Layout()) -> EvalResult:
    """Score the teacher, the untrained conversion and the student (and the repaired student) on the held-out
    split and every eval set; judge the gates; write metrics/eval.json, the report, the plots and the cards."""
    from zgdata.teacher.prepare import load_tokenizer

    t0 = time.perf_counter()
    cfg, gates, part = project.eval, project.gates, project.partition
    held, rows = heldout_set(layout, cfg.heldout_seqs)
    seq_len = held.ids.shape[1]
    if cfg.context_min_pos >= seq_len:
        raise ZgError(
            f"eval.context_min_pos {cfg.context_min_pos} is not below seq_len {seq_len}",
            key="eval.context_min_pos",
            fix=f"use a value below {seq_len}",
        )
    gen_rows, gen_prompt = (
        prompts(held.ids, cfg.generate_prompts, cfg.prompt_tokens) if cfg.generate_prompts else ([], held.ids[:0, :1])
    )
    if not (layout.student / "config.json").exists():
        raise ZgError(f"{layout.student} not found", fix="run `dvc repro assemble`")
    tok = load_tokenizer(layout)  # checks the teacher's files and tokenizer hash
    sets = eval_sets(project, layout, held, tok)
    targets = {s.name: targets_for(s, cfg) for s in sets}
    scores, continuations = _score_models(_models(project, layout), sets, targets, cfg, gen_prompt, gen_rows)
    shift = _shift(part, layout, rows, project.materialize, cfg.batch_size)
    figs = {s.name: {**figures(s, scores[s.name], targets[s.name], cfg), "lineage": s.lineage} for s in sets}
    h = figs[HELDOUT]
    result = {k: h[k] for k in _HEADLINE}
    result.update(
        shift=shift,
        gates_passed=judge_sets(gates, figs),
        heldout_sequences=int(len(held.ids)),
        heldout_tokens=held.lineage["tokens"],  # real tokens: pad packing's padding is not counted
        context_window=cfg.window,
        context_targets=int(len(targets[HELDOUT])),
        sets=figs,
        size=_size(layout),
    )
    text = _generation(result, tok, gen_rows, gen_prompt, continuations, cfg)
    if project.repair.enabled:
        add_repaired(result, scores, figs, gates, figures=lambda s, sc: figures(s, sc, targets[s.name], cfg), sets=sets)
    result["seconds"] = time.perf_counter() - t0
    ces = {m: {"ce": h[f"{m}_ce"]} for m in ("teacher", "untrained", "student")}
    if "repaired" in result:
        ces["repaired"] = {"ce": result["repaired"]["ce"]}
    _plots(layout, ces, shift, part, figs, result.get("repaired", {}).get("sets", {}))
    write_text(layout.generation_report, text)
    out = EvalResult(**result)
    write_metrics(layout.eval_metrics, out.metrics())
    write_eval_card(layout)  # the cards with these figures: models/student (+ repaired), reports/model_card.md
    return out

"""Typed views of zgtrain's other params.yaml sections: eval, gates, lm_eval, search, repair and export.

``ProjectConfig`` (zgtrain/project/config.py) parses each of them once, with ``train:`` and zgdata's sections.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from zgdata.config import MAX_BATCH, MAX_STEPS, Section, param, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.workload import TABLE_COSTS, WorkloadConfig

# train.warmup, repair.warmup and local.warmup: what zgtrain/fit/schedule.py lr_at does with it
WARMUP_HELP = (
    "Linear warmup steps (at warmup = steps the peak lr is reached on the last step only; above steps, never)."
)

__all__ = ["EvalConfig", "GatesConfig", "LmEvalConfig", "SearchConfig", "RepairConfig", "ExportConfig", "DEFAULT_DTYPE"]


@dataclass(kw_only=True, frozen=True)
class EvalConfig(Section):
    SECTION: ClassVar[str] = "eval"
    window: int = param(32, "Context use: tokens each fresh window keeps before its target.", ge=1)
    context_targets: int = param(512, "Context use: how many held-out target positions are scored.", ge=1)
    context_min_pos: int = param(256, "Context use: targets are drawn from positions >= this.", ge=1)
    heldout_seqs: int = param(0, "Held-out sequences for CE (0: all).", ge=0)
    batch_size: int = param(8, "Sequences per forward pass.", ge=1)
    seed: int = param(0, "Seed of the target sample, of each set's max_seqs sample and of the bootstrap.", ge=0)
    sets: list = param(
        [],
        "Extra evaluation sets besides the in-domain held-out split ('heldout'): a list of "
        "{name, source (path, glob, list, embedded:docs, or corpus:heldout: the corpus's held-out documents), "
        "format, text_field, id_field, max_seqs, context_targets, seq_len (0: corpus.seq_len; more: a long-context "
        "set)}; see zgtrain/evaluate/sets.py.",
    )
    bootstrap: int = param(
        1000,
        "Bootstrap resamples (of whole sequences) behind the 95% intervals of CE gap and context retention.",
        ge=10,
    )
    generate_prompts: int = param(
        3,
        "Generation check: held-out prompts continued greedily by teacher and student "
        "(reports/generation.md); 0: none.",
        ge=0,
    )
    prompt_tokens: int = param(32, "Generation check: tokens of each prompt.", ge=1)
    generate_tokens: int = param(32, "Generation check: new tokens of each greedy continuation.", ge=1)

    def validate(self):
        if self.context_min_pos < self.window:
            raise ZgError(
                f"eval.window={self.window} and eval.context_min_pos={self.context_min_pos}",
                key="eval.window",
                fix="need 1 <= window <= context_min_pos",
            )
        from zgtrain.project.eval_sets import parse_sets, spec_dicts

        object.__setattr__(self, "sets", spec_dicts(parse_sets(self.sets)))  # every key filled in

    def set_specs(self):
        """``sets`` as typed specs (zgtrain.project.eval_sets.EvalSetSpec)."""
        from zgtrain.project.eval_sets import parse_sets

        return parse_sets(self.sets)


@dataclass(kw_only=True, frozen=True)
class GatesConfig(Section):
    SECTION: ClassVar[str] = "gates"
    max_ce_gap: float = param(0.5, "Fail if student CE exceeds teacher CE by more than this many nats/token.")
    min_context_retention: float = param(0.5, "Fail if student context use / teacher context use is below this.")
    sets: list = param(
        ["heldout"],
        "Evaluation sets the gates judge ('heldout': the in-domain split, or names "
        "of eval.sets); every set's figures are reported either way.",
        item="str",
    )

    def check_sets(self, evaluation: EvalConfig) -> None:
        known = ["heldout"] + [s["name"] for s in evaluation.sets]
        if not self.sets:
            raise ZgError("gates.sets is empty", key="gates.sets", fix=f"name at least one of {', '.join(known)}")
        for name in self.sets:
            if name not in known:
                raise ZgError(
                    f"gates.sets names '{name}', which is not an evaluation set",
                    key="gates.sets",
                    fix=f"use names of {', '.join(known)} (eval.sets declares the extra ones)",
                )


@dataclass(kw_only=True, frozen=True)
class LmEvalConfig(Section):
    """`zg train lm-eval`: lm-evaluation-harness on teacher and student (zgtrain/evaluate/lm_eval.py)."""

    SECTION: ClassVar[str] = "lm_eval"
    tasks: list = param(
        [],
        "lm-eval tasks of the lm_eval stage: zg_nextline (built from the held-out split, "
        "offline) and/or standard ones (hellaswag, arc_easy, piqa, lambada_openai: need a local "
        "datasets cache). Empty: no lm_eval stage in dvc.yaml (rerun `zg pipeline` after "
        "editing); `zg train lm-eval` then runs zg_nextline.",
        item="str",
    )
    limit: int = param(0, "Examples scored per task (lm-eval's limit; 0: all).", ge=0)
    batch_size: int = param(8, "lm-eval batch size (requests per forward pass).", ge=1)
    examples: int = param(
        200, "zg_nextline: examples drawn from the held-out split (fewer if it has fewer lines).", ge=1
    )
    choices: int = param(
        4,
        "zg_nextline: choices per example (the true next line + distractors from other held-out segments).",
        ge=2,
        le=16,
    )
    context_lines: int = param(4, "zg_nextline: non-blank lines of context before the line to choose.", ge=1)
    seed: int = param(0, "zg_nextline: seed of the example sample, distractors and answer positions.", ge=0)

    def validate(self):
        for t in self.tasks:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", t):
                raise ZgError(
                    f"lm_eval.tasks is {repr(self.tasks)[:120]} ({t[:60]!r} is not a task name)",
                    key="lm_eval.tasks",
                    fix="use lm-eval task names (letters, digits, _ . -), e.g. [zg_nextline, hellaswag]",
                )


@dataclass(kw_only=True, frozen=True)
class SearchConfig(Section):
    SECTION: ClassVar[str] = "search"
    budget: float = param(
        0.625,
        "Budget of the searched mix: a fraction of the teacher's block cost (budget_unit: "
        "fraction) or an absolute cost (budget_unit: absolute).",
        gt=0,
    )
    budget_unit: str = param(
        "fraction",
        "fraction (of the teacher's summed block cost; for latency, of its whole time, embedding and head "
        "included) or absolute (for latency, the whole model's ms).",
        choices=("fraction", "absolute"),
    )
    cost: str = param(
        "params",
        "What the budget counts: params (block parameters), active_params (parameters one token runs: a "
        "mixture-of-experts block's all but the experts its router skips; params for dense blocks) or kv_bytes "
        "(KV-cache bytes per token at the teacher's longest context, zgtrain/block/kv_cache.py); measured at "
        "search.workload (the search_cost stage's table, `zg search costs`): latency (milliseconds of "
        "search.workload.phase on its runtime, the embedding and head included) or kv_cache (KV-cache bytes of the "
        "workload's sequences at their final length).",
        choices=("params", "active_params", "kv_bytes", *TABLE_COSTS),
    )
    limits: Any = param(
        {},
        "More constraints the mix must meet besides search.budget: {cost: bound}, each cost one of search.cost's "
        "choices and each bound in search.budget_unit (e.g. {params: 0.8, kv_bytes: 0.5}). latency and kv_cache "
        "(the KV-cache bytes of the workload's sequences, counted at its batch and length) come from the measured "
        "cost table (`zg search costs`).",
    )
    max_tries: int = param(
        3,
        "`zg search assemble` evaluates the best mix; if it fails a gate, the next-best mixes "
        "within the budget, up to this many in all. The first that passes is the student.",
        ge=1,
        le=5,
    )
    pool: int = param(
        5,
        "Mixes the search returns (search/choice.json's pool, best first): the best, then the best differing from "
        "every earlier one in at least search.diversity blocks. `zg search assemble` judges them in order.",
        ge=1,
        le=16,
    )
    diversity: int = param(
        1, "Blocks in which each pool mix differs from every better one (1: the pool is the K best mixes).", ge=1
    )
    workload: Any = param(
        {},
        "The serving workload the measured costs are timed at (search.workload.KEY below); used where search.cost "
        "or search.limits names latency or kv_cache.",
    )

    def validate(self):
        if not isinstance(self.workload, Mapping):
            raise ZgError(
                f"search.workload is {self.workload!r}",
                key="search.workload",
                fix="use a mapping, e.g. {runtime: torch, prompt: 64, generate: 16}",
            )
        _ = self.served  # parses search.workload, naming any bad key
        if not isinstance(self.limits, Mapping):
            raise ZgError(
                f"search.limits is {self.limits!r}", key="search.limits", fix="use a mapping, e.g. {params: 0.8}"
            )
        costs = SearchConfig.__dataclass_fields__["cost"].metadata["choices"]
        for name, bound in self.limits.items():
            if name not in costs:
                raise ZgError(
                    f"search.limits names {name!r}", key="search.limits", fix=f"use costs of {', '.join(costs)}"
                )
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound < math.inf:
                raise ZgError(
                    f"search.limits.{name} is {bound!r}", key=f"search.limits.{name}", fix="use a finite number > 0"
                )

    @property
    def served(self) -> WorkloadConfig:
        """search.workload, parsed."""
        return section({"search.workload": self.workload}, WorkloadConfig)

    @property
    def constraints(self) -> dict:
        """{cost: bound in budget_unit}: search.cost's budget first, then search.limits (search.cost's own bound
        there, if any, is an extra one only when tighter)."""
        out = {self.cost: float(self.budget)}
        for name, bound in self.limits.items():
            out[name] = min(out.get(name, float(bound)), float(bound))
        return out

    @property
    def measured(self) -> bool:
        """Whether the search needs the measured cost table (latency or kv_cache in search.cost or limits)."""
        return any(c in TABLE_COSTS for c in self.constraints)


@dataclass(kw_only=True, frozen=True)
class RepairConfig(Section):
    """Optional global distillation of the assembled student on the teacher's logits (zgtrain/repair/train.py)."""

    SECTION: ClassVar[str] = "repair"
    # eval_rows changes no trained bit either, but the KL before/after must be measured on the same rows
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("checkpoint_every",)
    UNRECORDED: ClassVar[tuple[str, ...]] = ("checkpoint_every",)
    steps: int = param(
        0,
        "Repair: optimizer steps of global distillation after assemble (0: no repair stage, the "
        "student is the final model). Trains on the train split only.",
        ge=0,
        le=MAX_STEPS,
    )
    trainable: str = param(
        "all",
        "Repair: what trains: all parameters, only the norms (layer norms + final norm), "
        "or lora (low-rank adapters on the decoder layers' nn.Linear modules, merged into "
        "the weights of models/repaired; GPT-2's Conv1D layers have none).",
        choices=("all", "norms", "lora"),
    )
    lora_rank: int = param(8, "Repair, trainable lora: rank of each adapter.", ge=1)
    lora_alpha: float = param(
        16.0, "Repair, trainable lora: the adapter's update is scaled by lora_alpha / lora_rank.", gt=0
    )
    temperature: float = param(
        2.0, "Repair: softmax temperature T of the KL(teacher || student) term (scaled by T^2).", gt=0, le=100
    )
    ce_weight: float = param(
        0.0, "Repair: weight of the next-token cross-entropy added to the KL term (0: KL only).", ge=0
    )
    batch_size: int = param(
        4, "Repair: whole train sequences per step (at most the train split's).", ge=1, le=MAX_BATCH
    )
    lr: float = param(1e-4, "Repair: peak learning rate (AdamW).", gt=0)
    beta1: float = param(0.9, "Repair: AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "Repair: AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.0, "Repair: AdamW weight decay.", ge=0)
    warmup: int = param(
        10,
        "Repair: " + WARMUP_HELP,
        ge=0,
    )
    schedule: str = param(
        "cosine",
        "Repair: LR schedule after warmup: cosine (to 10%), linear (to 0) or constant.",
        choices=("cosine", "linear", "constant"),
    )
    grad_clip: float = param(1.0, "Repair: max gradient norm (0 disables).", ge=0)
    seed: int = param(0, "Repair: seed offset; the run's seed is a stable hash of (params seed, this, 'repair').", ge=0)
    checkpoint_every: int = param(50, "Repair: steps between checkpoints (0: only at the end).", ge=0)
    eval_rows: int = param(
        16, "Repair: the KL before/after is reported on the first N train and N held-out sequences.", ge=1
    )
    threads: int = param(
        1, "Repair: torch CPU threads (part of the run's bits on CPU, like train.threads).", ge=1, le=1024
    )

    @property
    def enabled(self) -> bool:
        return self.steps > 0


DEFAULT_DTYPE = {"hf": "f32", "gguf": "f16"}
"""The weights type of an export by format, where ``export.dtype`` (or ``zg export --dtype``) is ``auto``."""


@dataclass(kw_only=True, frozen=True)
class ExportConfig(Section):
    """Optional `export` stage: the student as a deployable model with its lineage (zgtrain/export/run.py)."""

    SECTION: ClassVar[str] = "export"
    enabled: bool = param(
        False,
        "Export: add an `export` stage to dvc.yaml (`zg pipeline`) that runs `zg export` after the student's stage "
        "(false: no export stage, the pipeline is unchanged).",
    )
    student: str = param(
        "student",
        "Export: which student: student (models/student), repaired (models/repaired, with repair.steps > 0) or "
        "search (models/search/student).",
        choices=("student", "repaired", "search"),
    )
    format: str = param(
        "hf",
        "Export: hf (a stock transformers folder, loads without trust_remote_code; refused where the family's own "
        "config cannot say the student) or gguf (llama.cpp).",
        choices=("hf", "gguf"),
    )
    dtype: str = param(
        "auto",
        "Export: weights type: f32, f16, bf16 or q8_0 (gguf only); auto: f32 for hf, f16 for gguf.",
        choices=("auto", "f32", "f16", "bf16", "q8_0"),
    )
    out: str = param(
        "",
        "Export: output folder, relative to the project and outside the stages' folders (data/, models/teacher/, "
        "the blocks and students, metrics/, reports/, plots/; empty: models/export/<student>-<dtype>).",
    )

    def validate(self):
        if self.dtype == "q8_0" and self.format == "hf":
            raise ZgError(
                "export.dtype is q8_0, a GGUF type, but export.format is hf",
                key="export.dtype",
                fix="use export.format: gguf, or export.dtype f32, f16 or bf16",
            )
        p = Path(self.out)
        fix = "use a folder of its own, relative to the project, without '..' (e.g. models/export/student-f16)"
        if self.out and (p.is_absolute() or ".." in p.parts):
            raise ZgError(f"export.out is {self.out!r}", key="export.out", fix=fix)
        if self.out and (not p.parts or p.parts[0] in (".git", ".dvc", ".zg")):
            raise ZgError(
                f"export.out is {self.out!r}: the project folder or git's and DVC's own", key="export.out", fix=fix
            )
        for q in Layout(Path("")).stage_folders if self.out else ():
            if p == q or q in p.parents or p in q.parents:
                how = "is" if p == q else "is inside" if q in p.parents else "holds"
                raise ZgError(
                    f"export.out is {self.out!r}, which {how} {q}/, a stage's output", key="export.out", fix=fix
                )

    @property
    def resolved_dtype(self) -> str:
        return DEFAULT_DTYPE[self.format] if self.dtype == "auto" else self.dtype

    @property
    def out_dir(self) -> str:
        """The stage's output folder, relative to the project."""
        return self.out or Layout().export_dir(self.student, self.resolved_dtype).as_posix()

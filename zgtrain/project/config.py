"""Typed views of the params.yaml sections that zgtrain owns (train, eval, gates) and of the whole project.

``ProjectConfig.load`` is the one place params.yaml becomes configuration for zgtrain: it
parses every section once (partition included), resolves each block's ``train:`` overrides
and refuses anything unknown or out of range. Stage functions take the result, never a dict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from zgdata.config import (
    MAX_BATCH,
    MAX_STEPS,
    BlockSpec,
    CorpusConfig,
    MaterializeConfig,
    PartitionConfig,
    ProjectKind,
    SampleConfig,
    Section,
    TeacherConfig,
    VerifyConfig,
    check_int,
    load_params,
    param,
    project_kind,
    section,
)
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.local import LocalConfig
from zgtrain.project.workload import TABLE_COSTS, WorkloadConfig

__all__ = [
    "TrainConfig",
    "EvalConfig",
    "GatesConfig",
    "LmEvalConfig",
    "RepairConfig",
    "ExportConfig",
    "SearchConfig",
    "BlockRun",
    "ProjectConfig",
    "SECTIONS",
    "OPTIONAL_SECTIONS",
    "IDENTITY_VARIANT",
    "DEFAULT_DTYPE",
    "params_rows",
]


@dataclass(kw_only=True, frozen=True)
class TrainConfig(Section):
    SECTION: ClassVar[str] = "train"
    conversion: str = param(
        "prune_mlp",
        "How the student block starts: a conversion of zgtrain/block/conversions.py "
        "(identity, prune_mlp, drop_layers, reinit, window_attention, kv_heads, attn_linear, linear_attention; "
        "mixture-of-experts teachers: prune_experts, moe_to_dense).",
    )
    prune_ratio: float = param(
        0.5,
        "prune_mlp: fraction of MLP channels removed (by activation importance on the block's input data).",
        ge=0,
        lt=1,
    )
    keep_layers: list = param(
        [],
        "drop_layers: which of the block's layers to keep, as offsets within the block (e.g. [0, 2, 4]).",
        item="int",
    )
    window: int = param(
        128,
        "window_attention: each attention layer of the block sees only its last `window` tokens "
        "(itself included); a window >= the sequence length is the teacher's attention.",
        ge=1,
    )
    kv_heads: int = param(
        0,
        "kv_heads: key/value heads of each attention layer of the block, a divisor of the teacher's (each new head "
        "starts as the mean of its group of teacher heads); 0: half the teacher's, rounded down to a divisor.",
        ge=0,
    )
    linear_window: int = param(
        0,
        "linear_attention: exact softmax attention over each layer's last `linear_window` positions (itself "
        "included) beside the linear attention over the rest (LoLCATs' hybrid); 0: purely linear.",
        ge=0,
    )
    transfer_steps: int = param(
        0,
        "linear_attention: the first steps of train.steps train only the feature maps, to each layer's teacher "
        "attention output (attention transfer); 0: a quarter of train.steps.",
        ge=0,
        le=MAX_STEPS,
    )
    keep_experts: int = param(
        0,
        "prune_experts: experts kept in each layer of a mixture-of-experts block, those with the most routing mass "
        "on the block's input sample; 0: half the teacher's.",
        ge=0,
    )
    active_experts: int = param(
        0,
        "prune_experts: experts each token runs (top-k) in the block's layers; 0: the teacher's, clamped to "
        "train.keep_experts.",
        ge=0,
    )
    dense_width: int = param(
        0,
        "moe_to_dense: channels of the one dense MLP that replaces each layer's routed experts; 0: top-k x one "
        "expert's width (the teacher's active MLP width).",
        ge=0,
    )
    dense_init: str = param(
        "merge",
        "moe_to_dense: where the dense MLP's channels come from: merge (the channels of all experts with the most "
        "routing-weighted activation) or top (the most used experts whole); down-projections scaled by routing weight.",
        choices=("merge", "top"),
    )
    importance_rows: int = param(
        16,
        "prune_mlp: train sequences used to score channel importance; attn_linear: the sample its maps are fitted "
        "on; prune_experts / moe_to_dense: the sample routing mass and channel scores are measured on.",
        ge=1,
    )
    objective: str = param(
        "regress",
        "regress (clean MSE to the target boundary), noisy_regress (input + "
        "sigma*noise -> target), denoise (input + sigma*noise -> input, unanchored).",
    )
    normalize: str = param(
        "target",
        "Loss normalization per dimension: none, target (divide by the target's "
        "per-dim variance) or delta (regress the block's residual update, normalized "
        "by its variance).",
        choices=("none", "target", "delta"),
    )
    noise_sigma: float = param(
        0.1, "noisy_regress/denoise: noise std, relative to the input's per-dimension std.", ge=0
    )
    targets: str = param(
        "cached",
        "cached (read the stored boundaries) or online (recompute them with the teacher each batch).",
        choices=("cached", "online"),
    )
    steps: int = param(100, "Optimizer steps (0: keep the converted block untrained).", ge=0, le=MAX_STEPS)
    batch_size: int = param(4, "Whole sequences per step (at most the block's training sequences).", ge=1, le=MAX_BATCH)
    lr: float = param(1e-3, "Peak learning rate (AdamW).", gt=0)
    beta1: float = param(0.9, "AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    warmup: int = param(10, "Linear warmup steps.", ge=0)
    schedule: str = param(
        "cosine",
        "LR schedule after warmup: cosine (to 10%), linear (to 0) or constant.",
        choices=("cosine", "linear", "constant"),
    )
    grad_clip: float = param(1.0, "Max gradient norm (0 disables).", ge=0)
    seed: int = param(
        0, "Block seed offset; the block's seed is a stable hash of (params seed, this, block key).", ge=0
    )
    checkpoint_every: int = param(50, "Steps between checkpoints (0: only at the end).", ge=0)
    heldout_rows: int = param(0, "Held-out sequences for heldout_loss (0: all).", ge=0)
    threads: int = param(
        1,
        "torch CPU threads of a block's training; `zg repro` asks Ray for this many CPUs per "
        "block. Part of the run: on CPU another count can change the last bits.",
        ge=1,
        le=1024,
    )
    precision: str = param(
        "fp32",
        "Block forward + loss: fp32, or bf16 (torch.autocast; on a GPU box use bf16 with "
        "ZG_DEVICE=cuda). Weights and optimizer state stay fp32.",
        choices=("fp32", "bf16"),
    )

    def validate(self):
        from zgtrain.project.names import CONVERSIONS, OBJECTIVES  # names only: validating params needs no torch

        for key, registry in (("conversion", CONVERSIONS), ("objective", OBJECTIVES)):
            if getattr(self, key) not in registry:
                raise ZgError(
                    f"train.{key} is {getattr(self, key)!r}",
                    key=f"train.{key}",
                    fix=f"use one of {', '.join(registry)}",
                )


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
        "fraction", "fraction (of the teacher's summed block cost) or absolute.", choices=("fraction", "absolute")
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
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
                raise ZgError(f"search.limits.{name} is {bound!r}", key=f"search.limits.{name}", fix="use a number > 0")

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
    warmup: int = param(10, "Repair: linear warmup steps.", ge=0)
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


# Every section of params.yaml, in file order, with the class that parses it.
SECTIONS = {
    "teacher": TeacherConfig,
    "corpus": CorpusConfig,
    "partition": PartitionConfig,
    "materialize": MaterializeConfig,
    "verify": VerifyConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "gates": GatesConfig,
    "repair": RepairConfig,
    "lm_eval": LmEvalConfig,
}
# Sections a params.yaml may leave out (then: defaults); profiles write them only when they set them, so the
# default params.yaml does not change: search (with a variants: library), local (`zg init --profile local`).
# ``variants:`` (a mapping of named train overrides) is parsed below.
OPTIONAL_SECTIONS = {"search": SearchConfig, "local": LocalConfig, "export": ExportConfig}
_TOP = ("seed", *SECTIONS, "variants", *OPTIONAL_SECTIONS, "blocks")
# The search's name for "keep the teacher block": never a trained variant, so no variant may take it.
IDENTITY_VARIANT = "teacher"
_VARIANT_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")


@dataclass(kw_only=True, frozen=True)
class BlockRun:
    """One block as params define it: its boundary pair and its train config (``train:`` + ``blocks.KEY``)."""

    spec: BlockSpec
    train: TrainConfig
    overrides: tuple = field(default=(), compare=False)
    """The train keys ``blocks.KEY`` sets itself (the likely culprits when only this block fails)."""


def _block_train(base: TrainConfig, key: str, body: Mapping[str, Any], where: str = "blocks") -> TrainConfig:
    """``base`` with the train overrides of ``WHERE.KEY`` (a block's or a variant's), errors naming that key."""
    over = {k: v for k, v in body.items() if k not in ("in", "out")} if where == "blocks" else dict(body)
    known = set(asdict(base))
    unknown = sorted(set(map(str, over)) - known)
    if unknown:
        raise ZgError(
            f"unknown key(s) {', '.join(f'{where}.{key}.{u}' for u in unknown)}",
            key=f"{where}.{key}",
            fix=f"{'per-block' if where == 'blocks' else 'variant'} keys override train:, known: "
            f"{', '.join(sorted(known))}",
        )
    try:
        return TrainConfig(**{**asdict(base), **over})
    except ZgError as e:  # name the per-block (per-variant) key the bad value came from
        name = (e.key or "").removeprefix("train.")
        if name in over:
            raise ZgError(
                e.what.replace(f"train.{name}", f"{where}.{key}.{name}"), key=f"{where}.{key}.{name}", fix=e.fix
            ) from e
        raise


def _variants(base: TrainConfig, raw) -> dict:
    """``variants:`` -> {name: TrainConfig}: each variant is train: with its own overrides (not blocks.KEY's)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ZgError(
            f"params section 'variants' must be a mapping of name -> train overrides, not {type(raw).__name__}",
            key="variants",
            fix="e.g. variants: {p50: {prune_ratio: 0.5}}",
        )
    out = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not _VARIANT_NAME.fullmatch(name) or name == IDENTITY_VARIANT:
            raise ZgError(
                f"variant name {name!r} is not allowed",
                key=f"variants.{name}",
                fix=f"use 1-32 of a-z, 0-9, _ starting with a letter or digit (it names stages and "
                f"folders), not '{IDENTITY_VARIANT}' (the search's name for the teacher block)",
            )
        if not isinstance(body, Mapping) or not body:
            raise ZgError(
                f"variants.{name} must be a mapping of train keys it overrides",
                key=f"variants.{name}",
                fix="e.g. {conversion: prune_mlp, prune_ratio: 0.25}",
            )
        out[name] = _block_train(base, name, body, where="variants")
    return out


@dataclass(kw_only=True, frozen=True)
class ProjectConfig:
    """Every params.yaml section, parsed and checked once."""

    kind: ProjectKind = ProjectKind.CONVERT
    """convert (block by block from a teacher) or local (pretraining from scratch: a ``local:`` section)."""
    seed: int = 0
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    materialize: MaterializeConfig = field(default_factory=MaterializeConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    gates: GatesConfig = field(default_factory=GatesConfig)
    repair: RepairConfig = field(default_factory=RepairConfig)
    lm_eval: LmEvalConfig = field(default_factory=LmEvalConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    blocks: dict = field(default_factory=dict)
    """{key: BlockRun} for every block listed under ``blocks:``."""
    variants: dict = field(default_factory=dict)
    """{name: TrainConfig} of the variant library (``variants:``; empty: no variant stages)."""
    search: SearchConfig = field(default_factory=SearchConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ProjectConfig:
        unknown = sorted(set(map(str, params)) - set(_TOP))
        if unknown:
            raise ZgError(
                f"unknown params section(s) {', '.join(unknown)}",
                key=unknown[0],
                fix=f"known sections: {', '.join(_TOP)}",
            )
        kind = project_kind(params)
        sections = {name: section(params, cls_) for name, cls_ in {**SECTIONS, **OPTIONAL_SECTIONS}.items()}
        blocks_raw = params.get("blocks") or {}
        if not isinstance(blocks_raw, Mapping):
            raise ZgError("params section 'blocks' must be a mapping", key="blocks", fix="run `zg pipeline`")
        blocks = {}
        for key, body in blocks_raw.items():
            if not isinstance(body, Mapping):
                raise ZgError(
                    f"blocks.{key} must be a mapping with in/out",
                    key=f"blocks.{key}",
                    fix="run `zg pipeline` to regenerate blocks:",
                )
            spec = sections["partition"].block(str(key), body)
            blocks[spec.key] = BlockRun(
                spec=spec,
                train=_block_train(sections["train"], spec.key, body),
                overrides=tuple(str(k) for k in body if k not in ("in", "out")),
            )
        sections["gates"].check_sets(sections["eval"])
        variants = _variants(sections["train"], params.get("variants"))
        return cls(
            kind=kind, seed=check_int("seed", params.get("seed", 0), ge=0), blocks=blocks, variants=variants, **sections
        )

    @classmethod
    def load(cls, path: Path) -> ProjectConfig:
        return cls.from_params(load_params(path))

    def block(self, key: str) -> BlockRun:
        if key not in self.blocks:
            raise ZgError(
                f"block '{key}' is not in params.yaml blocks:",
                key="blocks",
                fix=f"use one of {', '.join(self.blocks) or '(none)'}, or run `zg pipeline`",
            )
        return self.blocks[key]

    def variant(self, key: str, name: str) -> BlockRun:
        """Block KEY trained as variant NAME: its boundary pair with ``train:`` + ``variants.NAME``."""
        spec = self.block(key).spec
        if name not in self.variants:
            raise ZgError(
                f"variant '{name}' is not in params.yaml variants:",
                key="variants",
                fix=f"use one of {', '.join(self.variants) or '(none: add a variants: section)'}",
            )
        return BlockRun(spec=spec, train=self.variants[name])


def params_rows() -> list[tuple[str, str, str]]:
    """(key, default, meaning) for every params.yaml key, in file order: what `zg params` shows."""
    from zgdata.config import describe

    rows = [
        (
            "seed",
            "0",
            ("global seed; each block derives its own by a stable hash with its key. Allowed: an integer >= 0."),
        )
    ]
    for sec, cls in {**SECTIONS, **OPTIONAL_SECTIONS}.items():
        rows += [(f"{sec}.{name}", default, doc) for name, default, doc in describe(cls)]
        if cls is CorpusConfig:  # the sample stage's keys, under corpus.sample
            rows += [(f"{SampleConfig.SECTION}.{n}", default, doc) for n, default, doc in describe(SampleConfig)]
        if cls is SearchConfig:
            rows += [(f"search.workload.{name}", default, doc) for name, default, doc in describe(WorkloadConfig)]
    rows.append(
        (
            "variants.NAME",
            "",
            (
                "optional variant library: each NAME is any train.* keys it overrides; "
                "`zg pipeline` adds a variant@BLOCK-NAME stage per block and a search stage"
            ),
        )
    )
    rows.append(("blocks.KEY", "", "per-block in/out boundary names plus any train.* key to override for that block"))
    return rows

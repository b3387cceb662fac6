"""Typed views of the params.yaml section ``train:`` and of the whole project.

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
    rekeyed,
    section,
)
from zgdata.errors import ZgError
from zgtrain.project.local import LocalConfig
from zgtrain.project.sections import (
    WARMUP_HELP,
    EvalConfig,
    ExportConfig,
    GatesConfig,
    LmEvalConfig,
    RepairConfig,
    SearchConfig,
)
from zgtrain.project.workload import WorkloadConfig

# params' blocks: section, or one block's entry, that is not a mapping (`zg pipeline` refuses it too)
BLOCKS_FIX = (
    "give each block's own train keys as a mapping (blocks.b00: {lr: 0.001}), or delete blocks: and run "
    "`zg pipeline` to regenerate it"
)

__all__ = [
    "TrainConfig",
    "BlockRun",
    "ProjectConfig",
    "SECTIONS",
    "OPTIONAL_SECTIONS",
    "IDENTITY_VARIANT",
    "params_rows",
]


@dataclass(kw_only=True, frozen=True)
class TrainConfig(Section):
    SECTION: ClassVar[str] = "train"
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("targets", "checkpoint_every")  # cached == online, bit for bit
    UNRECORDED: ClassVar[tuple[str, ...]] = ("checkpoint_every",)
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
        "Train sequences of the sample every conversion sets its loss normalization and noise scale from (so it "
        "changes the bits of any block); also prune_mlp: channel importance; attn_linear: the sample its maps are "
        "fitted on; prune_experts / moe_to_dense: the sample routing mass and channel scores are measured on.",
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
        "cached (read the stored boundaries) or online (recompute them with the teacher each batch; run "
        "`zg pipeline` after changing it: the train stages then depend on the teacher and the tokens).",
        choices=("cached", "online"),
    )
    steps: int = param(100, "Optimizer steps (0: keep the converted block untrained).", ge=0, le=MAX_STEPS)
    batch_size: int = param(4, "Whole sequences per step (at most the block's training sequences).", ge=1, le=MAX_BATCH)
    lr: float = param(1e-3, "Peak learning rate (AdamW).", gt=0)
    beta1: float = param(0.9, "AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    warmup: int = param(
        10,
        WARMUP_HELP,
        ge=0,
    )
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
    heldout_rows: int = param(
        0,
        "Held-out sequences for heldout_loss (0: all). heldout_loss divides the squared error by the target's spread "
        "around each batch's mean: compare it between runs of the same batch_size.",
        ge=0,
    )
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
        if self.normalize == "delta" and not OBJECTIVES[self.objective].anchored:
            raise ZgError(  # its target is its input: the update's variance is 0, every loss scaled by 1e8
                f"train.normalize is 'delta' with objective {self.objective!r}, whose target is its own input: "
                "there is no residual update to normalize by",
                key="train.normalize",
                fix="use normalize: target or none with this objective",
            )


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
        if (named := rekeyed(e, "train", f"{where}.{key}", over)) is None:
            raise
        raise named from e


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
        if kind is ProjectKind.LOCAL and sections["corpus"].packing == "pad":
            raise ZgError(  # its losses and held-out figures count every position of a row
                "local pretraining trains and scores every position of a row, so with corpus.packing: pad it would "
                "learn to predict the padding",
                key="corpus.packing",
                fix="use corpus.packing: eos for local pretraining",
            )
        blocks_raw = params.get("blocks") or {}
        if not isinstance(blocks_raw, Mapping):
            raise ZgError("params section 'blocks' must be a mapping", key="blocks", fix=BLOCKS_FIX)
        blocks = {}
        for key, body in blocks_raw.items():
            if not isinstance(body, Mapping):
                raise ZgError(
                    f"blocks.{key} must be a mapping with in/out",
                    key=f"blocks.{key}",
                    fix=BLOCKS_FIX,
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

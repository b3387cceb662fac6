"""Typed views of the params.yaml sections that zgtrain owns (train, eval, gates) and of the whole project.

``ProjectConfig.load`` is the one place params.yaml becomes configuration for zgtrain: it
parses every section once (partition included), resolves each block's ``train:`` overrides
and refuses anything unknown or out of range. Stage functions take the result, never a dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from zgdata.config import (BlockSpec, CorpusConfig, MaterializeConfig, PartitionConfig, Section, TeacherConfig,
                           VerifyConfig, check_int, load_params, param, section)
from zgdata.errors import ZgError

__all__ = ["TrainConfig", "EvalConfig", "GatesConfig", "RepairConfig", "BlockRun", "ProjectConfig", "SECTIONS"]


@dataclass(kw_only=True, frozen=True)
class TrainConfig(Section):
    SECTION: ClassVar[str] = "train"
    conversion: str = param("prune_mlp", "How the student block starts: a conversion of zgtrain/conversions.py "
                                         "(identity, prune_mlp, drop_layers, reinit).")
    prune_ratio: float = param(0.5, "prune_mlp: fraction of MLP channels removed (by activation importance on the "
                                    "block's input data).", ge=0, lt=1)
    keep_layers: list = param([], "drop_layers: which of the block's layers to keep, as offsets within the block "
                                  "(e.g. [0, 2, 4]).", item="int")
    importance_rows: int = param(16, "prune_mlp: train sequences used to score channel importance.", ge=1)
    objective: str = param("regress", "regress (clean MSE to the target boundary), noisy_regress (input + "
                                      "sigma*noise -> target), denoise (input + sigma*noise -> input, unanchored).")
    normalize: str = param("target", "Loss normalization per dimension: none, target (divide by the target's "
                                     "per-dim variance) or delta (regress the block's residual update, normalized "
                                     "by its variance).", choices=("none", "target", "delta"))
    noise_sigma: float = param(0.1, "noisy_regress/denoise: noise std, relative to the input's per-dimension std.",
                               ge=0)
    targets: str = param("cached", "cached (read the stored boundaries) or online (recompute them with the teacher "
                                   "each batch).", choices=("cached", "online"))
    steps: int = param(100, "Optimizer steps (0: keep the converted block untrained).", ge=0)
    batch_size: int = param(4, "Whole sequences per step.", ge=1)
    lr: float = param(1e-3, "Peak learning rate (AdamW).", gt=0)
    beta1: float = param(0.9, "AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    warmup: int = param(10, "Linear warmup steps.", ge=0)
    schedule: str = param("cosine", "LR schedule after warmup: cosine (to 10%), linear (to 0) or constant.",
                          choices=("cosine", "linear", "constant"))
    grad_clip: float = param(1.0, "Max gradient norm (0 disables).", ge=0)
    seed: int = param(0, "Block seed offset; the block's seed is a stable hash of (params seed, this, block key).",
                      ge=0)
    checkpoint_every: int = param(50, "Steps between checkpoints (0: only at the end).", ge=0)
    heldout_rows: int = param(0, "Held-out sequences for heldout_loss (0: all).", ge=0)
    threads: int = param(1, "torch CPU threads of a block's training; `zg repro` asks Ray for this many CPUs per "
                            "block. Part of the run: on CPU another count can change the last bits.", ge=1, le=1024)
    precision: str = param("fp32", "Block forward + loss: fp32, or bf16 (torch.autocast; on a GPU box use bf16 with "
                                   "ZG_DEVICE=cuda). Weights and optimizer state stay fp32.", choices=("fp32", "bf16"))

    def validate(self):
        from zgtrain.conversions import CONVERSIONS
        from zgtrain.objectives import OBJECTIVES

        for key, registry in (("conversion", CONVERSIONS), ("objective", OBJECTIVES)):
            if getattr(self, key) not in registry:
                raise ZgError(f"train.{key} is {getattr(self, key)!r}", key=f"train.{key}",
                              fix=f"use one of {', '.join(registry)}")


@dataclass(kw_only=True, frozen=True)
class EvalConfig(Section):
    SECTION: ClassVar[str] = "eval"
    window: int = param(32, "Context use: tokens each fresh window keeps before its target.", ge=1)
    context_targets: int = param(512, "Context use: how many held-out target positions are scored.", ge=1)
    context_min_pos: int = param(256, "Context use: targets are drawn from positions >= this.", ge=1)
    heldout_seqs: int = param(0, "Held-out sequences for CE (0: all).", ge=0)
    batch_size: int = param(8, "Sequences per forward pass.", ge=1)
    seed: int = param(0, "Seed of the target sample.", ge=0)

    def validate(self):
        if self.context_min_pos < self.window:
            raise ZgError(f"eval.window={self.window} and eval.context_min_pos={self.context_min_pos}",
                          key="eval.window", fix="need 1 <= window <= context_min_pos")


@dataclass(kw_only=True, frozen=True)
class GatesConfig(Section):
    SECTION: ClassVar[str] = "gates"
    max_ce_gap: float = param(0.5, "Fail if student CE exceeds teacher CE by more than this many nats/token.")
    min_context_retention: float = param(0.5, "Fail if student context use / teacher context use is below this.")


@dataclass(kw_only=True, frozen=True)
class RepairConfig(Section):
    """Optional global distillation of the assembled student on the teacher's logits (zgtrain/repair.py)."""

    SECTION: ClassVar[str] = "repair"
    steps: int = param(0, "Repair: optimizer steps of global distillation after assemble (0: no repair stage, the "
                          "student is the final model). Trains on the train split only.", ge=0)
    trainable: str = param("all", "Repair: what trains: all parameters, only the norms (layer norms + final norm), "
                                  "or lora (low-rank adapters on the decoder layers' nn.Linear modules, merged into "
                                  "the weights of models/repaired; GPT-2's Conv1D layers have none).",
                           choices=("all", "norms", "lora"))
    lora_rank: int = param(8, "Repair, trainable lora: rank of each adapter.", ge=1)
    lora_alpha: float = param(16.0, "Repair, trainable lora: the adapter's update is scaled by lora_alpha / lora_rank.",
                              gt=0)
    temperature: float = param(2.0, "Repair: softmax temperature T of the KL(teacher || student) term (scaled by "
                                     "T^2).", gt=0, le=100)
    ce_weight: float = param(0.0, "Repair: weight of the next-token cross-entropy added to the KL term (0: KL only).",
                             ge=0)
    batch_size: int = param(4, "Repair: whole train sequences per step.", ge=1)
    lr: float = param(1e-4, "Repair: peak learning rate (AdamW).", gt=0)
    beta1: float = param(0.9, "Repair: AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "Repair: AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.0, "Repair: AdamW weight decay.", ge=0)
    warmup: int = param(10, "Repair: linear warmup steps.", ge=0)
    schedule: str = param("cosine", "Repair: LR schedule after warmup: cosine (to 10%), linear (to 0) or constant.",
                          choices=("cosine", "linear", "constant"))
    grad_clip: float = param(1.0, "Repair: max gradient norm (0 disables).", ge=0)
    seed: int = param(0, "Repair: seed offset; the run's seed is a stable hash of (params seed, this, 'repair').",
                      ge=0)
    checkpoint_every: int = param(50, "Repair: steps between checkpoints (0: only at the end).", ge=0)
    eval_rows: int = param(16, "Repair: the KL before/after is reported on the first N train and N held-out "
                               "sequences.", ge=1)
    threads: int = param(1, "Repair: torch CPU threads (part of the run's bits on CPU, like train.threads).",
                         ge=1, le=1024)

    @property
    def enabled(self) -> bool:
        return self.steps > 0


# Every section of params.yaml, in file order, with the class that parses it.
SECTIONS = {"teacher": TeacherConfig, "corpus": CorpusConfig, "partition": PartitionConfig,
            "materialize": MaterializeConfig, "verify": VerifyConfig, "train": TrainConfig, "eval": EvalConfig,
            "gates": GatesConfig, "repair": RepairConfig}
_TOP = ("seed", *SECTIONS, "blocks")


@dataclass(kw_only=True, frozen=True)
class BlockRun:
    """One block as params define it: its boundary pair and its train config (``train:`` + ``blocks.KEY``)."""

    spec: BlockSpec
    train: TrainConfig


def _block_train(base: TrainConfig, key: str, body: Mapping[str, Any]) -> TrainConfig:
    over = {k: v for k, v in body.items() if k not in ("in", "out")}
    known = set(asdict(base))
    unknown = sorted(set(map(str, over)) - known)
    if unknown:
        raise ZgError(f"unknown key(s) {', '.join(f'blocks.{key}.{u}' for u in unknown)}", key=f"blocks.{key}",
                      fix=f"per-block keys override train:, known: {', '.join(sorted(known))}")
    try:
        return TrainConfig(**{**asdict(base), **over})
    except ZgError as e:  # name the per-block key the bad value came from
        name = (e.key or "").removeprefix("train.")
        if name in over:
            raise ZgError(e.what.replace(f"train.{name}", f"blocks.{key}.{name}"), key=f"blocks.{key}.{name}",
                          fix=e.fix) from e
        raise


@dataclass(kw_only=True, frozen=True)
class ProjectConfig:
    """Every params.yaml section, parsed and checked once."""

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
    blocks: dict = field(default_factory=dict)
    """{key: BlockRun} for every block listed under ``blocks:``."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ProjectConfig":
        unknown = sorted(set(map(str, params)) - set(_TOP))
        if unknown:
            raise ZgError(f"unknown params section(s) {', '.join(unknown)}", key=unknown[0],
                          fix=f"known sections: {', '.join(_TOP)}")
        sections = {name: section(params, cls_) for name, cls_ in SECTIONS.items()}
        blocks_raw = params.get("blocks") or {}
        if not isinstance(blocks_raw, Mapping):
            raise ZgError("params section 'blocks' must be a mapping", key="blocks", fix="run `zg pipeline`")
        blocks = {}
        for key, body in blocks_raw.items():
            if not isinstance(body, Mapping):
                raise ZgError(f"blocks.{key} must be a mapping with in/out", key=f"blocks.{key}",
                              fix="run `zg pipeline` to regenerate blocks:")
            spec = sections["partition"].block(str(key), body)
            blocks[spec.key] = BlockRun(spec=spec, train=_block_train(sections["train"], spec.key, body))
        return cls(seed=check_int("seed", params.get("seed", 0), ge=0), blocks=blocks, **sections)

    @classmethod
    def load(cls, path: Path) -> "ProjectConfig":
        return cls.from_params(load_params(path))

    def block(self, key: str) -> BlockRun:
        if key not in self.blocks:
            raise ZgError(f"block '{key}' is not in params.yaml blocks:", key="blocks",
                          fix=f"use one of {', '.join(self.blocks) or '(none)'}, or run `zg pipeline`")
        return self.blocks[key]

"""The ``local:`` params section: greedy local pretraining of a small Llama from scratch (no teacher weights).

``partition.boundaries`` cuts the model's ``local.layers`` decoder layers into K gradient-isolated
blocks (K=1 is end-to-end training). Only projects made with ``zg init --profile local`` (or
``local-tiny``) carry this section in params.yaml; its defaults are the ``local`` profile's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zgdata.config import MAX_BATCH, MAX_STEPS, Section, param, rekeyed
from zgdata.errors import ZgError
from zgtrain.project.sections import WARMUP_HELP

__all__ = ["LocalConfig", "BLOCK_KEYS"]

# What `local.blocks.bNN` may override for one block (each block has its own optimizer).
BLOCK_KEYS = ("steps", "lr", "warmup", "weight_decay", "grad_clip")


@dataclass(kw_only=True, frozen=True)
class LocalConfig(Section):
    SECTION: ClassVar[str] = "local"
    # the schedule orders the same work (docs/concepts/guarantees.md); the held-out keys only score the result
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("schedule", "checkpoint_every", "heldout_seqs", "eval_batch_size")
    UNRECORDED: ClassVar[tuple[str, ...]] = ("checkpoint_every",)  # the metrics record the schedule
    # the model (a transformers LlamaConfig; untied embeddings: the first and last block must not share a tensor)
    layers: int = param(
        8,
        "Decoder layers of the model trained from scratch; partition.boundaries must run from 0 "
        "to this (K = its blocks).",
        ge=1,
    )
    hidden: int = param(256, "Hidden size.", ge=8)
    heads: int = param(4, "Attention heads (hidden must be a multiple).", ge=1)
    kv_heads: int = param(4, "Key/value heads (heads must be a multiple).", ge=1)
    intermediate: int = param(768, "MLP width of each decoder layer (and of the MLP auxiliary head).", ge=1)
    init_std: float = param(0.02, "Std of the random initialization (LlamaConfig.initializer_range).", gt=0)
    # the local objective of every block but the last (the last uses the model's own norm and LM head)
    aux: str = param(
        "mlp",
        "Auxiliary head of blocks 0..K-2: mlp (a residual MLP) or transformer (one extra decoder "
        "layer), then its own norm and LM head, trained on next-token loss.",
        choices=("mlp", "transformer"),
    )
    mtp: str = param(
        "none",
        "Multi-token prediction (t+2 .. t+mtp_depth) added at the first block boundary, at "
        "every boundary (the last block's output included), or nowhere.",
        choices=("none", "first", "all"),
    )
    mtp_depth: int = param(2, "Farthest token predicted by the MTP term (2: t+2 only).", ge=2)
    mtp_weight: float = param(1.0, "Weight of the MTP term (mean over its offsets) in a block's loss.", ge=0)
    mode: str = param(
        "simultaneous",
        "simultaneous: every block trains on every batch, reading its predecessor's "
        "live output. sequential: one DVC stage per block; block k trains to the end, "
        "its outputs over every row become data/local/hNN.lance, block k+1 trains "
        "from that dataset.",
        choices=("simultaneous", "sequential"),
    )
    blocks: dict = param(
        {},
        "Per-block overrides, e.g. {b01: {lr: 2e-3}}: steps (sequential mode only), lr, warmup, "
        "weight_decay, grad_clip. In sequential mode `zg pipeline` lists every block, so that "
        "editing block k reruns blocks k..K-1 only.",
    )
    # execution: both schedules give bitwise-identical parameters (blocks are gradient-isolated)
    schedule: str = param(
        "phased",
        "phased: every block's forward, then every backward + optimizer step. "
        "early_backward: a block's backward and step are issued as soon as its forward "
        "ends (on CUDA on that block's own stream, overlapping the next block's forward).",
        choices=("phased", "early_backward"),
    )
    # optimization, the same for every block (each has its own AdamW state)
    steps: int = param(1000, "Optimizer steps; every block takes one per batch.", ge=0, le=MAX_STEPS)
    batch_size: int = param(
        8, "Sequences per step (at most the train split's); every arm sees the same seeded batches.", ge=1, le=MAX_BATCH
    )
    lr: float = param(1e-3, "Peak learning rate (AdamW), linear warmup then cosine to 10%.", gt=0)
    warmup: int = param(
        50,
        WARMUP_HELP,
        ge=0,
    )
    beta1: float = param(0.9, "AdamW beta1.", ge=0, lt=1)
    beta2: float = param(0.95, "AdamW beta2.", ge=0, lt=1)
    weight_decay: float = param(0.1, "AdamW weight decay.", ge=0)
    grad_clip: float = param(1.0, "Max gradient norm per block (0 disables).", ge=0)
    seed: int = param(
        0,
        "Seed offset of the run: initial weights, batch order and each block's RNG derive from "
        "(params seed, this) by stable hashes; K, aux, mtp and schedule never change the batches.",
        ge=0,
    )
    checkpoint_every: int = param(100, "Steps between checkpoints of all blocks (0: only at the end).", ge=0)
    heldout_seqs: int = param(0, "Held-out sequences scored for the full model's CE (0: all).", ge=0)
    eval_batch_size: int = param(8, "Sequences per forward when scoring held-out CE.", ge=1)
    threads: int = param(1, "torch CPU threads (part of the run's bits on CPU).", ge=1, le=1024)
    precision: str = param(
        "fp32",
        "Every block's forward and loss: fp32, or bf16 autocast (parameters, AdamW state "
        "and the saved model stay fp32). bf16 runs the LM heads' matmuls about 3x faster "
        "on CPUs with AMX and on GPUs; it is deterministic too.",
        choices=("fp32", "bf16"),
    )

    def validate(self):
        if not isinstance(self.blocks, dict):
            raise ZgError(
                f"local.blocks is {self.blocks!r}",
                key="local.blocks",
                fix="use a mapping of block keys to overrides, e.g. {b01: {lr: 0.002}}",
            )
        for key, over in self.blocks.items():
            over = {} if over is None else over
            if not isinstance(over, dict) or set(map(str, over)) - set(BLOCK_KEYS):
                raise ZgError(
                    f"local.blocks.{key} is {over!r}",
                    key=f"local.blocks.{key}",
                    fix=f"override only {', '.join(BLOCK_KEYS)}",
                )
            if "steps" in over and self.mode != "sequential":
                raise ZgError(
                    f"local.blocks.{key}.steps is set but local.mode is {self.mode}",
                    key=f"local.blocks.{key}.steps",
                    fix="every block takes every step in simultaneous mode",
                )
            self.of(str(key))  # range-checks the values, naming local.blocks.KEY.NAME
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise ZgError(
                f"local.hidden={self.hidden}, local.heads={self.heads}, local.kv_heads={self.kv_heads}",
                key="local.heads",
                fix="hidden must be a multiple of heads with an even head size, and heads a multiple of kv_heads",
            )

    def of(self, key: str) -> LocalConfig:
        """This config with block ``key``'s overrides applied (and no ``blocks``)."""
        from dataclasses import asdict

        over = self.blocks.get(key) or {}
        try:
            return LocalConfig(**{**asdict(self), **over, "blocks": {}})
        except ZgError as e:  # a block's own key: every value but its overrides was checked before
            if (named := rekeyed(e, "local", f"local.blocks.{key}", over)) is None:
                raise
            raise named from e

"""What the repair stage trains and what it matches: the student wrapped for checkpointing, the teacher's
logits rebuilt from the head slice, and the distillation loss.

The teacher's logits are the head slice (final norm + LM head) applied to the last stored boundary, the
residual stream after the teacher's last layer and before its final norm. So repair never runs a teacher
forward pass; the logits differ from the teacher's own only by the boundary's storage rounding (bf16 by
default), the same targets block training regresses.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from zgdata.errors import ZgError
from zgdata.families.registry import family_of

__all__ = ["RepairModel", "LoRALinear", "TeacherHead", "distill_loss", "token_kl"]


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update ``scale * B @ A`` (B starts at zero: no change at
    step 0). Written here rather than taken from peft: a dozen lines, no new dependency, and the adapters
    checkpoint through zgtrain/fit/checkpoint.py like any other tensor."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gen: torch.Generator):
        super().__init__()
        self.base = base
        a = torch.randn(rank, base.in_features, generator=gen) / base.in_features**0.5
        self.lora_a = nn.Parameter(a.to(base.weight.device, base.weight.dtype))
        self.lora_b = nn.Parameter(
            torch.zeros(base.out_features, rank, device=base.weight.device, dtype=base.weight.dtype)
        )
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        self.base.weight += (self.lora_b @ self.lora_a) * self.scale
        return self.base


class RepairModel(nn.Module):
    """The assembled causal LM with the interface zgtrain/fit/checkpoint.py expects of a block.

    ``weights()`` is the trainable tensors only (a checkpoint holds what changes; the frozen rest is the
    student folder, pinned by its hash in the run identity). The model stays in eval mode while it trains:
    no dropout (GPT-2 has some), so a step is a pure function of weights, optimizer state and batch.
    """

    def __init__(
        self,
        lm: nn.Module,
        trainable: str,
        *,
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        gen: torch.Generator | None = None,
    ):
        super().__init__()
        self.lm = lm.eval()
        fam = family_of(lm.config)
        if trainable == "lora":
            for p in lm.parameters():
                p.requires_grad_(False)
            for layer in fam.layers(lm):
                for name, mod in list(layer.named_modules()):
                    if type(mod) is nn.Linear:
                        parent, _, leaf = name.rpartition(".")
                        setattr(
                            layer.get_submodule(parent) if parent else layer,
                            leaf,
                            LoRALinear(mod, lora_rank, lora_alpha, gen),
                        )
            keep = {id(p) for m in lm.modules() if isinstance(m, LoRALinear) for p in (m.lora_a, m.lora_b)}
        elif trainable == "norms":
            keep = {id(p) for layer in fam.layers(lm) for n in fam.layer_norms for p in getattr(layer, n).parameters()}
            keep |= {id(p) for p in fam.final_norm(lm).parameters()}
        else:
            keep = {id(p) for p in lm.parameters()}
        for p in lm.parameters():
            p.requires_grad_(id(p) in keep)
        if not keep:
            raise ZgError(
                f"repair.trainable={trainable} selects no parameter of this {fam.model_type} student",
                key="repair.trainable",
                fix="use repair.trainable: all",
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32 logits."""
        return self.lm(input_ids=ids).logits.float()

    def merge_adapters(self) -> None:
        """Fold every LoRA adapter into its linear layer: the model is a plain transformers model again."""
        for parent in list(self.lm.modules()):
            for leaf, child in list(parent.named_children()):
                if isinstance(child, LoRALinear):
                    setattr(parent, leaf, child.merged())

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def weights(self) -> dict[str, torch.Tensor]:
        # named_parameters drops tied duplicates (lm_head = embed_tokens), which safetensors could not save
        return {n: p for n, p in self.named_parameters() if p.requires_grad}

    def load_state_dict(self, state, strict: bool = False, assign: bool = False):
        """Load the trainable tensors of a checkpoint; (missing, unexpected) name only trainable ones."""
        own = self.weights()
        unexpected = sorted(set(state) - set(own))
        missing = sorted(set(own) - set(state))
        bad_shape = [k for k in set(own) & set(state) if own[k].shape != state[k].shape]
        if unexpected or missing or bad_shape:
            return missing + bad_shape, unexpected or bad_shape
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(state[k])
        return [], []


class TeacherHead(nn.Module):
    """The teacher's final norm + LM head, from the head slice: last boundary (B, T, C) -> logits (B, T, V)."""

    def __init__(self, head: dict[str, torch.Tensor], student: nn.Module):
        super().__init__()
        fam = family_of(student.config)
        self.family = fam
        # the student's final-norm module gives the family's norm class and eps; its weights come from the slice
        self.norm = copy.deepcopy(fam.final_norm(student)).float().eval()
        prefix = fam.norm_attr + "."
        norm = {k[len(prefix) :]: v.float() for k, v in head.items() if k.startswith(prefix)}
        if "lm_head.weight" not in head or not norm:
            raise ZgError(
                "the head slice lacks the final norm or lm_head.weight",
                key="teacher",
                fix="re-run `dvc repro teacher` (or `dvc pull models/teacher/blocks/head.safetensors`)",
            )
        self.norm.load_state_dict(norm, strict=True)
        self.register_buffer("weight", head["lm_head.weight"].float(), persistent=False)
        for p in self.norm.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.family.finish_logits(F.linear(self.norm(h.float()), self.weight))


def token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(B, T) KL(teacher || student) per position, of the softmaxes at ``temperature``."""
    ls = F.log_softmax(student_logits / temperature, dim=-1)
    lt = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(ls, lt, log_target=True, reduction="none").sum(-1)


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float,
    ce_weight: float,
) -> torch.Tensor:
    """T^2 * mean KL over real positions (Hinton's scaling keeps gradients comparable across T), plus
    ``ce_weight`` * next-token cross-entropy over real targets. ``mask`` (B, T) is False at padding."""
    m = mask.float()
    kl = (token_kl(student_logits, teacher_logits, temperature) * m).sum() / m.sum().clamp_min(1)
    loss = kl * temperature**2
    if ce_weight:
        tm = m[:, 1:]
        ce = F.cross_entropy(student_logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        loss = loss + ce_weight * (ce * tm).sum() / tm.sum().clamp_min(1)
    return loss

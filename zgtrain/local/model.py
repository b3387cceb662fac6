"""A small Llama trained from scratch, cut into K gradient-isolated blocks with local heads.

The whole model is one ``LlamaForCausalLM`` built from a seeded random init that does not depend
on K, so every arm of a study starts from the same trunk. Each ``LocalBlock`` holds references to
its slice of that model (block 0 also the token embedding; the last block also the final norm and
the real LM head), so training a block trains the model in place and the trained model is saved
with ``save_pretrained`` as it is. Blocks 0..K-2 add an auxiliary head (a residual MLP or one
extra decoder layer, then a norm and an LM head of their own) for a local next-token loss; with
``mtp`` a block also predicts tokens t+2 .. t+d through small projections into its head. Nothing
the auxiliary or MTP heads hold is part of the saved model.
"""

from __future__ import annotations

import torch
from torch import nn

from zgdata.core.runtime import autocast, compute_dtype
from zgdata.families.registry import family
from zgtrain.local.linear_ce import linear_ce
from zgtrain.project.local import LocalConfig

__all__ = ["llama_config", "build_model", "LocalBlock", "make_blocks"]

_LLAMA = family("llama")


def llama_config(
    cfg: LocalConfig, *, vocab_size: int, max_positions: int, bos: int | None, eos: int | None, pad: int | None
):
    from transformers import LlamaConfig

    c = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=cfg.init_std,
        tie_word_embeddings=False,  # a tied embedding would be shared by the first and the last block
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    c._attn_implementation = "sdpa"
    return c


def build_model(config, seed: int):
    """The full model at its random init: a pure function of (config, seed), whatever K is."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed % (2**63))
        return LlamaForCausalLM(config).eval()


class _AuxMLP(nn.Module):
    """h + down(silu(gate(norm h)) * up(norm h)): one residual SwiGLU MLP, as in a Llama layer."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, h, inputs):
        return h + self.mlp(self.norm(h))


class _AuxLayer(nn.Module):
    """One extra decoder layer (the Transformer auxiliary head)."""

    def __init__(self, config):
        super().__init__()
        self.layer = _LLAMA.make_layer(config, 0)

    def forward(self, h, inputs):
        return _LLAMA.call_layer(self.layer, h, inputs)


class LocalBlock(nn.Module):
    """Decoder layers [lo, hi) of the model plus the head its loss reads (aux, or the model's own for the last)."""

    def __init__(
        self,
        model,
        lo: int,
        hi: int,
        *,
        first: bool,
        last: bool,
        aux: str,
        mtp_offsets: list[int],
        gen: torch.Generator,
        precision: str = "fp32",
    ):
        super().__init__()
        self.precision = precision
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        config, inner = model.config, model.model
        self.first, self.last, self.mtp_offsets = first, last, list(mtp_offsets)
        if first:
            self.embed_tokens = inner.embed_tokens
        self.layers = nn.ModuleList(inner.layers[lo:hi])
        self.rotary_emb = _LLAMA.rotary(config)  # buffers derived from the config, never saved (see weights())
        fresh = []
        if last:
            self.norm, self.lm_head = inner.norm, model.lm_head
        else:
            self.aux = _AuxMLP(config) if aux == "mlp" else _AuxLayer(config)
            self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            fresh += [self.aux, self.norm, self.lm_head]
        self.mtp = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size, bias=False) for _ in mtp_offsets)
        fresh.append(self.mtp)
        # fresh heads draw from the block's own generator: the trunk's init never depends on them
        with torch.no_grad():
            for m in fresh:
                for _, p in sorted(m.named_parameters()):
                    if p.dim() >= 2:
                        p.copy_(torch.randn(p.shape, generator=gen) * config.initializer_range)

    def weights(self) -> dict[str, torch.Tensor]:
        """Trainable tensors only (the rotary buffers are derived from the config)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}

    def forward(self, x: torch.Tensor, ids: torch.Tensor, *, mtp_weight: float = 1.0):
        """(boundary out, loss, {term: detached value}): x is token ids for block 0, else the previous boundary.

        Under ``precision: bf16`` the boundary passed on is cast back to fp32, so the next block's input
        (and a sequential run's stored boundary) has one dtype whatever the precision.
        """
        with autocast(x.device, self.precision):
            h, loss, terms = self._forward(x, ids, mtp_weight)
        return h.float(), loss.float(), terms

    def boundary(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output alone (no head, no loss): what ``forward`` passes on, bit for bit."""
        with autocast(x.device, self.precision):
            h, _ = self._trunk(x)
        return h.float()

    def _trunk(self, x):
        h = self.embed_tokens(x) if self.first else x
        inputs = _LLAMA.layer_inputs(self.rotary_emb, h)
        for layer in self.layers:
            h = _LLAMA.call_layer(layer, h, inputs)
        return h, inputs

    def _forward(self, x, ids, mtp_weight):
        h, inputs = self._trunk(x)
        z = h if self.last else self.aux(h, inputs)
        loss = self._ce(z, ids, 1)
        terms = {"next": loss.detach()}
        if self.mtp_offsets:
            mtp = torch.stack([self._ce(z + proj(z), ids, d) for proj, d in zip(self.mtp, self.mtp_offsets)]).mean()
            terms["mtp"] = mtp.detach()
            loss = loss + mtp_weight * mtp
        return h, loss, terms

    def _ce(self, z: torch.Tensor, ids: torch.Tensor, offset: int) -> torch.Tensor:
        """Mean CE of token t+offset from position t, through this block's norm and head (zgtrain/local/linear_ce.py)."""
        y = self.norm(z[:, :-offset]).float()
        return linear_ce(
            y.reshape(-1, y.shape[-1]),
            self.lm_head.weight,
            ids[:, offset:].reshape(-1),
            dtype=compute_dtype(self.precision),
        )


def make_blocks(model, boundaries: list[int], cfg: LocalConfig, gens: list[torch.Generator]) -> list[LocalBlock]:
    """One LocalBlock per partition block; MTP at block 0 (``first``) or at every block (``all``)."""
    k = len(boundaries) - 1
    offsets = list(range(2, cfg.mtp_depth + 1))
    return [
        LocalBlock(
            model,
            lo,
            hi,
            first=i == 0,
            last=i == k - 1,
            aux=cfg.aux,
            gen=gens[i],
            mtp_offsets=offsets if cfg.mtp == "all" or (cfg.mtp == "first" and i == 0) else [],
            precision=cfg.precision,
        )
        for i, (lo, hi) in enumerate(zip(boundaries, boundaries[1:]))
    ]

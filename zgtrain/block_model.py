"""A student block: a stack of decoder layers mapping boundary k to boundary k+1.

It runs the layers exactly as the teacher's own forward does (rotary embeddings from
position 0, sdpa causal attention, no mask), so an identity block reproduces the
teacher's boundary bit for bit.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["StudentBlock", "layer_config"]


def layer_config(config, intermediate_size: int):
    cfg = copy.deepcopy(config)
    cfg.intermediate_size = intermediate_size
    cfg._attn_implementation = "sdpa"
    return cfg


class StudentBlock(nn.Module):
    def __init__(self, config, intermediate_sizes: list[int]):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        self.intermediate_sizes = list(intermediate_sizes)
        self.layers = nn.ModuleList(LlamaDecoderLayer(layer_config(config, m), layer_idx=i)
                                    for i, m in enumerate(intermediate_sizes))
        self.rotary_emb = LlamaRotaryEmbedding(config=layer_config(config, config.intermediate_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) boundary k -> (B, T, C) boundary k+1."""
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T)
        pe = self.rotary_emb(h, position_ids=pos)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=pos)
        return h

    def weights(self) -> dict[str, torch.Tensor]:
        """Trainable tensors only (the rotary buffers are derived from the config)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}

    def mlp_activations(self, h: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the MLP's intermediate activation act(gate(x)) * up(x): (B, T, I)."""
        acts = []
        hooks = [layer.mlp.down_proj.register_forward_hook(lambda m, inp, out: acts.append(inp[0].detach()))
                 for layer in self.layers]
        try:
            self.forward(h)
        finally:
            for hk in hooks:
                hk.remove()
        return acts

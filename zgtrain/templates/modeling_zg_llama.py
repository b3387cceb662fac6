"""Llama with a per-layer MLP width, shipped inside ZeroGraph students whose blocks differ in shape.

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.
"""

import copy

from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP


class ZgLlamaConfig(LlamaConfig):
    model_type = "zg_llama"

    def __init__(self, intermediate_sizes=None, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_sizes = list(intermediate_sizes or [self.intermediate_size] * self.num_hidden_layers)


class ZgLlamaForCausalLM(LlamaForCausalLM):
    config_class = ZgLlamaConfig

    def __init__(self, config):
        super().__init__(config)
        for layer, width in zip(self.model.layers, config.intermediate_sizes):
            cfg = copy.copy(config)
            cfg.intermediate_size = width
            layer.mlp = LlamaMLP(cfg)
        self.post_init()

"""Qwen2 with a per-layer MLP width, shipped inside ZeroGraph students whose blocks differ in shape.

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.
"""

import copy

from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP


class ZgQwen2Config(Qwen2Config):
    model_type = "zg_qwen2"

    def __init__(self, intermediate_sizes=None, **kwargs):
        super().__init__(**kwargs)
        self.intermediate_sizes = list(intermediate_sizes or [self.intermediate_size] * self.num_hidden_layers)


class ZgQwen2ForCausalLM(Qwen2ForCausalLM):
    config_class = ZgQwen2Config

    def __init__(self, config):
        super().__init__(config)
        for layer, width in zip(self.model.layers, config.intermediate_sizes):
            cfg = copy.copy(config)
            cfg.intermediate_size = width
            layer.mlp = Qwen2MLP(cfg)
        self.post_init()

"""GPT-2 with a per-layer MLP width, shipped inside ZeroGraph students whose blocks differ in shape.

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.
"""

from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP


class ZgGPT2Config(GPT2Config):
    model_type = "zg_gpt2"

    def __init__(self, intermediate_sizes=None, **kwargs):
        super().__init__(**kwargs)
        width = self.n_inner if self.n_inner is not None else 4 * self.n_embd
        self.intermediate_sizes = list(intermediate_sizes or [width] * self.n_layer)


class ZgGPT2LMHeadModel(GPT2LMHeadModel):
    config_class = ZgGPT2Config

    def __init__(self, config):
        super().__init__(config)
        for block, width in zip(self.transformer.h, config.intermediate_sizes):
            block.mlp = GPT2MLP(width, config)
        self.post_init()

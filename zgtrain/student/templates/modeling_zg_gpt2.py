"""GPT-2 with a per-layer MLP width and per-layer sliding-window attention, shipped inside ZeroGraph
students whose blocks differ in shape or attention window.

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.

``layer_windows`` (one entry per layer; null: full attention) restricts a layer's attention to its last
W positions, itself included. Such layers need ``attn_implementation`` sdpa (the default) or eager.

The class between "generated" markers is zg's own, copied from the source file its marker names by
zgtrain/student/template_source.py, so a student block and the assembled student run the same code.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP


# >>> generated from zgtrain/block/window.py: SlidingWindow (edit it there)
class SlidingWindow:
    """Forward pre-hook (``with_kwargs=True``) of an attention module: attend to the last ``window`` positions only.

    Keys are indexed as the KV cache holds them (0 .. past + new - 1, past = tokens already cached
    for this layer). Supports sdpa (boolean masks) and eager (additive float masks) attention.
    """

    def __init__(self, window: int):
        self.window = int(window)

    def __call__(self, module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        q_len = hidden.shape[-2]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = cache.get_seq_length(module.layer_idx) if cache is not None else 0
        if past + q_len <= self.window:  # nobody sees beyond the window: full attention, untouched
            return None
        impl = getattr(module.config, "_attn_implementation", None) or "eager"
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"zg sliding-window layers need attn_implementation 'sdpa' or 'eager', not {impl!r}")
        mask = kwargs.get("attention_mask")
        kv_len = mask.shape[-1] if mask is not None else past + q_len
        q = torch.arange(past, past + q_len, device=hidden.device)[:, None]
        k = torch.arange(kv_len, device=hidden.device)[None, :]
        band = (k <= q) & (k > q - self.window)                            # (q_len, kv_len)
        if mask is None and impl == "sdpa":
            mask = band[None, None]
        elif mask is None:
            mask = torch.zeros(band.shape, dtype=hidden.dtype, device=hidden.device)[None, None]
            mask = mask.masked_fill(~band, torch.finfo(hidden.dtype).min)
        elif mask.dtype == torch.bool:
            mask = mask & band
        else:
            mask = mask.masked_fill(~band, torch.finfo(mask.dtype).min)
        return args, {**kwargs, "attention_mask": mask}
# <<< generated


class ZgGPT2Config(GPT2Config):
    model_type = "zg_gpt2"

    def __init__(self, intermediate_sizes=None, layer_windows=None, **kwargs):
        super().__init__(**kwargs)
        width = self.n_inner if self.n_inner is not None else 4 * self.n_embd
        self.intermediate_sizes = list(intermediate_sizes or [width] * self.n_layer)
        self.layer_windows = list(layer_windows or [None] * self.n_layer)


class ZgGPT2LMHeadModel(GPT2LMHeadModel):
    config_class = ZgGPT2Config

    def __init__(self, config):
        super().__init__(config)
        for block, width in zip(self.transformer.h, config.intermediate_sizes):
            block.mlp = GPT2MLP(width, config)
        for block, window in zip(self.transformer.h, config.layer_windows):
            if window is not None:
                block.attn.register_forward_pre_hook(SlidingWindow(window), with_kwargs=True)
        self.post_init()

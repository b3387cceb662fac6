"""Any dense decoder family with a per-layer MLP width and per-layer sliding-window attention, shipped inside
ZeroGraph students whose blocks differ in shape or attention window (Llama, Qwen2, Mistral, Granite, OLMo 2, ...).

zg loads it with ``zgtrain.student.load_student``, which first checks that this file is byte for byte
the one zg wrote (sha256 pinned in zerograph.json). Outside zg, pass ``trust_remote_code`` to
``AutoModelForCausalLM.from_pretrained`` only after checking that hash yourself.

The classes ``Zg<Config>`` and ``Zg<CausalLM>`` (e.g. ``ZgMistralConfig``, ``ZgMistralForCausalLM``) are made on
first access from transformers' own classes of those names: each layer keeps the family's
stock decoder layer, and its MLP is rebuilt as the family's own MLP class at that layer's width
(``intermediate_sizes``). ``layer_windows`` (one entry per layer; null: full attention) restricts a layer's
attention to its last W positions, itself included. Such layers need ``attn_implementation`` sdpa (the
default) or eager. ``layer_kv_heads`` (one entry per layer) is each layer's number of key/value heads: a layer
whose count differs from ``num_key_value_heads`` gets the family's own attention class built with its count.
``layer_attention`` (one entry per layer: "full", or "linear": one linear map of the normed input in place of
the attention, no KV cache) is zg's attn_linear conversion; "linear_attention" or "linear_attention:W" (the
attention linearized with learned feature maps over its own q/k/v/o, plus exact softmax over the last W
positions; constant-size generation state in ``LinearAttentionState``) is zg's linear_attention conversion.
A mixture-of-experts family (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) names its MLP config fields in ``mlp_fields``
(``width``: one expert's width, ``experts``, ``top_k``); each layer's MLP is then the family's own expert block
built with that layer's width, ``layer_experts`` experts and ``layer_top_k`` of them run per token (zg's
prune_experts and moe_to_dense conversions).

The classes between "generated" markers are zg's own, copied from the source file each marker names by
zgtrain/student/template_source.py, so a student block and the assembled student run the same code.
"""

import copy

import torch
import transformers
from transformers.cache_utils import DynamicLayer


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


# >>> generated from zgtrain/block/attention.py: AttentionLinearState, AttentionLinear (edit it there)
class AttentionLinearState(DynamicLayer):
    """The cache layer of one ``attn_linear`` layer in place of a full-attention one: zero KV heads per position.

    Its keys and values are empty tensors (B, 0, T, 1), 0 bytes, whose positions dimension counts the T positions
    seen; ``DynamicLayer`` reads 0 from any empty tensor, and transformers reads past lengths and mask sizes from the
    first full-attention layer, so this layer reads T from the shape. Crop, beam reorder and batch expansion act on
    the empty tensors as on any others, so the count follows them.
    """

    def get_seq_length(self):
        return self.keys.shape[-2] if self.is_initialized and self.keys.dim() == 4 else 0


class AttentionLinear(torch.nn.Module):
    """A decoder layer's attention replaced by one linear map of its normed input: no token mixing.

    Called as the attention module it replaces (hidden_states, mask, rotary and cache keywords; only the cache is
    read), it returns ``(linear(hidden_states), None)``. Under a KV cache it caches zero heads per position, so the
    cache still counts the sequence (transformers reads past lengths from it) and holds 0 bytes for this layer; a
    full-attention cache layer is first replaced by an ``AttentionLinearState`` (sliding ones already count).
    """

    def __init__(self, hidden_size, layer_idx, layer_type=None):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        self.layer_idx = layer_idx
        self.layer_type = layer_type  # the replaced attention's type (Gemma 3 picks its layer inputs by it)

    def forward(self, hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            layers = cache.layers
            while len(layers) <= self.layer_idx:
                layers.append(AttentionLinearState())
            if type(layers[self.layer_idx]) is DynamicLayer:
                layers[self.layer_idx] = AttentionLinearState()
            empty = hidden_states.new_zeros(hidden_states.shape[0], 0, hidden_states.shape[1], 1)
            cache.update(empty, empty, self.layer_idx)
        return self.linear(hidden_states), None
# <<< generated


# >>> generated from zgtrain/block/attention.py: LinearAttentionState, LinearAttention (edit it there)
class LinearAttentionState(DynamicLayer):
    """The generation cache of one ``linear_attention`` layer: constant size, whatever the sequence length.

    ``state`` is (S, z, window keys, window values): S (B, KV heads, F, D) = sum of phi(k) v^T and z (B, KV heads, F)
    = sum of phi(k) over the keys that have left the exact-softmax window, and the window's last W - 1 keys and
    values after rotary (B, KV heads, <= W - 1, D; none for window 0). ``seen`` counts the positions, so transformers
    reads the sequence length from it. Beam search reorders it; it cannot be cropped (assisted decoding).
    """

    is_croppable = False

    def __init__(self):
        super().__init__()
        self.seen = 0
        self.state = None

    def get_seq_length(self):
        return self.seen

    def get_mask_sizes(self, query_length, *args):
        return self.seen + query_length, 0

    def reorder_cache(self, beam_idx):
        if self.state is not None:
            self.state = tuple(t.index_select(0, beam_idx.to(t.device)) for t in self.state)

    def reset(self):
        self.seen, self.state = 0, None


class LinearAttention(torch.nn.Module):
    """A decoder layer's softmax attention linearized with learned feature maps (Hedgehog / LoLCATs), optionally plus
    exact softmax attention over its last ``window`` positions (itself included; 0: purely linear).

    The teacher's q/k/v/o projections and rotary are kept. Per head, phi(x) = [softmax(x W + b), softmax(-(x W + b))]
    over the head dimension (F = 2 D features; W starts as the identity, b as 0), one map for queries (per query
    head) and one for keys (per KV head). A query at position i attends with weights phi(q_i) . phi(k_j) to keys
    j <= i - window and, if window > 0, with sigmoid(window_factor) exp(q_i . k_j * scaling - m_i) to the keys j in
    (i - window, i] (m_i: the row's maximum), one normalizer over both (LoLCATs' sliding-window hybrid).
    Without a cache the forward is the parallel causal form (quadratic in T); under a cache the keys that leave the
    window fold into S = sum phi(k) v^T and z = sum phi(k) (``LinearAttentionState``), so each new token costs O(1)
    memory. Both run the one ``attend`` below, on the same positions.
    """

    def __init__(self, attention, window=0, layer_idx=0, layer_type=None):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj
        )
        self.head_dim = int(attention.head_dim)
        self.scaling = float(attention.scaling)
        self.heads = self.q_proj.out_features // self.head_dim
        self.kv_heads = self.k_proj.out_features // self.head_dim
        self.window = int(window)
        self.layer_idx = layer_idx
        self.layer_type = layer_type  # the replaced attention's type (Gemma 3 picks its layer inputs by it)
        d = self.head_dim
        self.feature_q = torch.nn.Parameter(torch.eye(d).repeat(self.heads, 1, 1))  # (H, D, D)
        self.feature_q_bias = torch.nn.Parameter(torch.zeros(self.heads, d))
        self.feature_k = torch.nn.Parameter(torch.eye(d).repeat(self.kv_heads, 1, 1))  # (KV heads, D, D)
        self.feature_k_bias = torch.nn.Parameter(torch.zeros(self.kv_heads, d))
        if self.window > 0:
            self.window_factor = torch.nn.Parameter(torch.zeros(self.heads))  # sigmoid: 0.5 at the start

    @staticmethod
    def window_of(kind):
        """The window of a ``layer_attention`` kind: "linear_attention" (0) or "linear_attention:W"."""
        return int(kind.partition(":")[2] or 0)

    @staticmethod
    def phi(x, w, b):
        """(B, H, T, D) -> (B, H, T, 2 D): the Hedgehog feature map, each half a softmax over D."""
        y = torch.einsum("bhtd,hde->bhte", x, w.to(x.dtype)) + b.to(x.dtype)[None, :, None]
        return torch.cat([torch.softmax(y, -1), torch.softmax(-y, -1)], -1)

    def attend(self, q, k, v, state=None, seen=0, keep=False):
        """q (B, H, T, D), k and v (B, KV heads, T, D) of positions seen..seen+T-1 after rotary, with the cache
        ``state`` of the positions before (None: none). Returns ((B, H, T, D), the new state if ``keep``)."""
        b, _, t, d = q.shape
        g = self.heads // self.kv_heads
        if state is None:
            f = 2 * d
            state = (q.new_zeros(b, self.kv_heads, f, d), q.new_zeros(b, self.kv_heads, f), k[:, :, :0], v[:, :, :0])
        s, z, kw, vw = state
        keys, values = torch.cat([kw, k], 2), torch.cat([vw, v], 2)  # positions seen - P .. seen + T - 1
        fk = self.phi(keys, self.feature_k, self.feature_k_bias)  # (B, KV heads, P + T, F)
        fq = self.phi(q, self.feature_q, self.feature_q_bias)  # (B, H, T, F)
        p = kw.shape[2]
        diff = torch.arange(t, device=q.device)[:, None] + p - torch.arange(p + t, device=q.device)[None, :]
        lin = (diff >= self.window).to(q.dtype)  # query i sees key j linearly when j <= i - window
        fk_h, v_h = fk.repeat_interleave(g, 1), values.repeat_interleave(g, 1)
        a = (fq @ fk_h.transpose(-1, -2)) * lin  # (B, H, T, P + T)
        num = a @ v_h + fq @ s.repeat_interleave(g, 1)
        den = a.sum(-1) + (fq * z.repeat_interleave(g, 1)[:, :, None]).sum(-1)
        if self.window > 0:
            scores = (q @ keys.repeat_interleave(g, 1).transpose(-1, -2)) * self.scaling
            scores = scores.masked_fill((diff < 0) | (diff >= self.window), float("-inf"))
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            e = e * torch.sigmoid(self.window_factor).to(q.dtype)[None, :, None, None]
            num, den = num + e @ v_h, den + e.sum(-1)
        out = num / den[..., None]
        if not keep:
            return out, None
        old = p + t - min(max(self.window - 1, 0), p + t)  # positions that leave the window for good
        s = s + fk[:, :, :old].transpose(-1, -2) @ values[:, :, :old]
        z = z + fk[:, :, :old].sum(2)
        return out, (s, z, keys[:, :, old:], values[:, :, old:])

    @staticmethod
    def _rotate(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, hidden_states, *args, **kwargs):
        b, t, _ = hidden_states.shape
        d = self.head_dim
        q = self.q_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + self._rotate(q) * sin, k * cos + self._rotate(k) * sin
        dt = torch.promote_types(q.dtype, torch.float32)  # half precision: the sums run in float32
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None:
            out, _ = self.attend(q, k, v)
        else:
            layers = cache.layers
            while len(layers) <= self.layer_idx:
                layers.append(LinearAttentionState())
            if not isinstance(layers[self.layer_idx], LinearAttentionState):
                layers[self.layer_idx] = LinearAttentionState()
            layer = layers[self.layer_idx]
            out, layer.state = self.attend(q, k, v, layer.state, layer.seen, keep=True)
            layer.seen += t
        out = out.to(hidden_states.dtype).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out), None
# <<< generated


_MADE = {}


def _config_class(prefix):
    base = getattr(transformers, prefix + "Config")

    def __init__(
        self,
        intermediate_sizes=None,
        layer_windows=None,
        layer_kv_heads=None,
        layer_attention=None,
        mlp_fields=None,
        layer_experts=None,
        layer_top_k=None,
        **kwargs,
    ):
        base.__init__(self, **kwargs)
        if mlp_fields:  # a mixture-of-experts family: its MLP config fields, and each layer's counts
            n = self.num_hidden_layers
            self.mlp_fields = dict(mlp_fields)
            self.layer_experts = list(layer_experts or [getattr(self, mlp_fields["experts"])] * n)
            self.layer_top_k = list(layer_top_k or [getattr(self, mlp_fields["top_k"])] * n)
        self.intermediate_sizes = list(intermediate_sizes or [self.intermediate_size] * self.num_hidden_layers)
        self.layer_windows = list(layer_windows or [None] * self.num_hidden_layers)
        self.layer_kv_heads = list(layer_kv_heads or [self.num_key_value_heads] * self.num_hidden_layers)
        self.layer_attention = list(layer_attention or ["full"] * self.num_hidden_layers)

    attrs = {"model_type": "zg_" + base.model_type, "__init__": __init__, "__module__": __name__}
    return type("Zg" + prefix + "Config", (base,), attrs)


def _model_class(prefix):
    base = getattr(transformers, prefix + "ForCausalLM")

    def __init__(self, config):
        base.__init__(self, config)
        fields = getattr(config, "mlp_fields", None) or {"width": "intermediate_size"}
        for i, (layer, width) in enumerate(zip(self.model.layers, config.intermediate_sizes)):
            cfg = copy.copy(config)
            setattr(cfg, fields["width"], width)
            if "experts" in fields:  # this layer's experts and experts per token
                setattr(cfg, fields["experts"], config.layer_experts[i])
                setattr(cfg, fields["top_k"], config.layer_top_k[i])
            layer.mlp = type(layer.mlp)(cfg)
        for i, (layer, heads) in enumerate(zip(self.model.layers, config.layer_kv_heads)):
            if heads != config.num_key_value_heads:  # this layer's own KV head count
                cfg = copy.copy(config)
                cfg.num_key_value_heads = heads
                layer.self_attn = type(layer.self_attn)(cfg, layer_idx=i)
        for i, (layer, kind) in enumerate(zip(self.model.layers, config.layer_attention)):
            if kind == "linear":  # no attention: one linear map of the normed input
                layer.self_attn = AttentionLinear(config.hidden_size, i, getattr(layer.self_attn, "layer_type", None))
            elif kind.startswith("linear_attention"):  # linearized attention with learned feature maps
                window = LinearAttention.window_of(kind)
                layer.self_attn = LinearAttention(
                    layer.self_attn, window, i, getattr(layer.self_attn, "layer_type", None)
                )
        for layer, window in zip(self.model.layers, config.layer_windows):
            if window is not None:
                layer.self_attn.register_forward_pre_hook(SlidingWindow(window), with_kwargs=True)
        self.post_init()

    config_class = _made("Zg" + base.config_class.__name__)  # e.g. Gemma3ForCausalLM's is Gemma3TextConfig
    attrs = {"config_class": config_class, "__init__": __init__, "__module__": __name__}
    return type("Zg" + prefix + "ForCausalLM", (base,), attrs)


def _made(name):
    if name not in _MADE:
        if name.startswith("Zg") and name.endswith("ForCausalLM"):
            _MADE[name] = _model_class(name[2 : -len("ForCausalLM")])
        elif name.startswith("Zg") and name.endswith("Config"):
            _MADE[name] = _config_class(name[2 : -len("Config")])
        else:
            raise AttributeError(name)
    return _MADE[name]


def __getattr__(name):
    try:
        return _made(name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

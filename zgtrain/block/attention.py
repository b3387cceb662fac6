"""Student attention layers with fewer key/value heads (the ``kv_heads`` conversion).

A layer with ``n`` KV heads is the family's own decoder layer built from a copy of the layer config with
``num_key_value_heads = n``: transformers' attention then repeats each KV head for ``heads / n`` query heads,
so query head ``i`` reads KV head ``i // (heads / n)``. The teacher's query head ``i`` read its KV head
``i // (heads / kv)``; grouping the teacher's KV heads into ``n`` contiguous groups of ``kv / n`` keeps every
query head attending to the group its old KV head belonged to, and each new head starts as the mean of its
group (weights, biases, and per-channel key norms such as OLMo 2's ``k_norm``: all exactly ``mean(dim=group)``).
With ``n`` equal to the teacher's count every group holds one head and the layer is the teacher's, bit for bit.

Phi-3's fused ``qkv_proj`` (rows: queries, keys, values) is split, its key and value rows grouped, and joined
again. GPT-2 has no grouped-query attention in transformers: refused.

``attn_linear`` replaces a layer's attention by ``AttentionLinear``: one linear map (with bias) of the layer's
normed input, so no token mixing and no KV cache (under a cache it stores zero KV heads per position, in an
``AttentionLinearState`` that reads the sequence length from their shape). It is fitted by least squares on the
block's input sample (``fit_linear``), layer after layer on the student's own running input, to the teacher
attention's output there.
Why: some layers' attention output is mostly a function of the current token (attending to itself, or to a
near-constant average of the context); the best linear map of the token's own state keeps that part exactly in
the least-squares sense, where dropping the attention (zero) or a random map starts from far worse, and training
then recovers what it can. The assembled student runs the same class: each shipped modeling template carries a
copy of both classes generated from this file (``python -m zgtrain.student.template_source``).

``linear_attention`` replaces a layer's attention by ``LinearAttention``: the teacher's own q/k/v/o projections and
rotary, with softmax attention linearized by learned Hedgehog feature maps (LoLCATs), optionally beside exact softmax
over a short window. The maps start as the identity map; zgtrain/block/train.py first fits them alone to the teacher
attention's output (``transfer_loss``: LoLCATs' attention transfer), then trains the block as any other. Generation
keeps a constant-size state per layer in the cache (``LinearAttentionState``, a transformers ``DynamicLayer``
subclass put in place of the cache's layer by the module itself, so ``generate``'s own ``DynamicCache`` carries it
and reads the sequence length from it), so memory per new token is O(1). Both classes are copied into the templates
the same way (tests/zgtrain/student/test_template_source.py fails while a copy differs).
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicLayer

from zgdata.errors import ZgError

__all__ = [
    "attention_heads",
    "teacher_kv_heads",
    "resolve_kv_heads",
    "kv_layer_config",
    "group_kv_heads",
    "AttentionLinear",
    "AttentionLinearState",
    "check_attn_linear",
    "fit_linear",
    "attention_io",
    "LinearAttention",
    "LinearAttentionState",
    "check_linear_attention",
    "linear_kind",
    "transfer_parameters",
    "transfer_loss",
    "attention_call",
]

_KEY = "train.kv_heads"


def attention_heads(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a teacher config."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return heads, kv, hd


def teacher_kv_heads(config) -> int:
    return attention_heads(config)[1]


def resolve_kv_heads(config, requested: int) -> int:
    """The KV heads of a ``kv_heads`` student layer: ``requested``, or (0) half the teacher's rounded down to a
    divisor of it (1 at least). One-line ZgError naming ``train.kv_heads`` for a family or count zg cannot build."""
    if config.model_type == "gpt2":
        raise ZgError(
            "the kv_heads conversion needs grouped-query attention, which transformers' GPT-2 does not have",
            key="train.conversion",
            fix="use another conversion for GPT-2 teachers (prune_mlp, drop_layers, window_attention)",
        )
    heads, kv, _ = attention_heads(config)
    if requested == 0:
        return max(d for d in range(1, max(1, kv // 2) + 1) if kv % d == 0)
    if requested < 1 or kv % requested or heads % requested:
        divisors = [d for d in range(1, kv + 1) if kv % d == 0]
        raise ZgError(
            f"{_KEY} is {requested}, which does not divide the teacher's {kv} KV heads and {heads} query heads",
            key=_KEY,
            fix=f"use one of {', '.join(map(str, divisors))} (0: half the teacher's, {resolve_kv_heads(config, 0)})",
        )
    return requested


def kv_layer_config(config, kv_heads: int | None):
    """A copy of a layer config with ``kv_heads`` KV heads (None: the config itself)."""
    if kv_heads is None or kv_heads == teacher_kv_heads(config):
        return config
    cfg = copy.copy(config)
    cfg.num_key_value_heads = int(kv_heads)
    return cfg


def _group(x: torch.Tensor, n: int, hd: int) -> torch.Tensor:
    """Rows (dim 0) of ``kv * hd`` channels, head-major, as ``n`` heads: each the mean of ``kv / n`` contiguous."""
    rows = x.shape[0]
    return x.reshape(n, rows // (n * hd), hd, *x.shape[1:]).mean(dim=1).reshape(n * hd, *x.shape[1:])


def group_kv_heads(layer: dict[str, torch.Tensor], config, n: int) -> dict[str, torch.Tensor]:
    """A teacher layer's tensors (names within the layer) with its KV heads grouped to ``n``."""
    heads, kv, hd = attention_heads(config)
    out = dict(layer)
    for name, x in layer.items():
        if not name.startswith("self_attn."):
            continue
        part = name.split(".")[1]
        if part in ("k_proj", "v_proj") or (part == "k_norm" and x.shape[0] == kv * hd):
            out[name] = _group(x, n, hd)
        elif part == "qkv_proj":  # Phi-3: [queries; keys; values] rows
            q, k, v = x.split([heads * hd, kv * hd, kv * hd])
            out[name] = torch.cat([q, _group(k, n, hd), _group(v, n, hd)])
    return out


# fmt: off
# (copied into the shipped modeling template by `python -m zgtrain.student.template_source`)
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
# fmt: on


def check_attn_linear(config) -> None:
    if config.model_type == "gpt2":  # verified decoders without `self_attn`: conversions._require_parts
        raise ZgError(
            "the attn_linear conversion is built for decoders whose layers call `self_attn` (not GPT-2's `attn`)",
            key="train.conversion",
            fix="use another conversion for GPT-2 teachers (prune_mlp, drop_layers, window_attention)",
        )


def fit_linear(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, b) minimizing ||x W^T + b - y||^2 over every position of x, y (..., C), in float64 (normal equations
    on centred data, ridge ``ridge`` x the mean variance for rank-deficient samples); returned in float32."""
    xs, ys = x.reshape(-1, x.shape[-1]).double(), y.reshape(-1, y.shape[-1]).double()
    mx, my = xs.mean(0), ys.mean(0)
    xc, yc = xs - mx, ys - my
    gram = xc.T @ xc
    gram = gram + (ridge * gram.diagonal().mean() + 1e-12) * torch.eye(gram.shape[0], dtype=gram.dtype)
    w = torch.linalg.solve(gram, xc.T @ yc).T  # (C out, C in)
    return w.float(), (my - w @ mx).float()


def attention_io(family, layer, h: torch.Tensor, inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the attention's input, its output, the layer's output) of one decoder layer run on ``h``."""
    a_in, _, a_out, out = attention_call(family, layer, h, inputs)
    return a_in, a_out, out


# fmt: off
# (copied into the shipped modeling template by `python -m zgtrain.student.template_source`)
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
# fmt: on


def check_linear_attention(config, layer) -> None:
    """Refuse a teacher whose attention the linear_attention conversion cannot rebuild from q/k/v/o and rotary."""
    attn = getattr(layer, "self_attn", None)
    plain = all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"))
    extra = [n for n in ("q_norm", "k_norm") if getattr(attn, n, None) is not None]
    if getattr(config, "attn_logit_softcapping", None):
        extra.append("attn_logit_softcapping")
    if not plain or extra:
        what = f"its {', '.join(extra)}" if plain else "no separate q/k/v/o projections"
        raise ZgError(
            f"the linear_attention conversion rebuilds attention from q/k/v/o projections and rotary, and "
            f"{config.model_type}'s attention has {what}",
            key="train.conversion",
            fix="use linear_attention on Llama, Qwen2, Mistral or Granite teachers, or another conversion here",
        )


def linear_kind(window: int) -> str:
    """The ``layer_attention`` kind of a linear_attention layer of this window."""
    return "linear_attention" if window == 0 else f"linear_attention:{window}"


def transfer_parameters(block) -> set[str]:
    """Names of the parameters attention transfer trains: the feature maps (and window factors) of ``block``."""
    return {
        n for n, _ in block.named_parameters() if ".self_attn.feature_" in n or n.endswith(".self_attn.window_factor")
    }


def transfer_loss(teacher, block, x: torch.Tensor) -> torch.Tensor:
    """Attention transfer (LoLCATs' first stage): the mean over the block's linear_attention layers of the squared
    error of each layer's output against the teacher layer's attention output, on the teacher's own stream (``x``
    run through the teacher's layers, one after the other), each normalized by the teacher output's mean square
    so that layers of different scales weigh alike."""
    fam = teacher.family
    with torch.no_grad():
        inputs = fam.layer_inputs(getattr(teacher, "rotary_emb", None), x)
    losses, h = [], x
    for t_layer, s_layer in zip(teacher.layers, block.layers):
        with torch.no_grad():
            a_in, a_kw, a_out, h = attention_call(fam, t_layer, h, inputs)
        if isinstance(s_layer.self_attn, LinearAttention):
            y = s_layer.self_attn(a_in, **a_kw)[0]
            y, a_out = y.float(), a_out.float()  # under bf16 autocast both come out of bf16 linears
            losses.append((y - a_out).pow(2).mean() / a_out.pow(2).mean().clamp_min(1e-12))
    return torch.stack(losses).mean()


def attention_call(family, layer, h: torch.Tensor, inputs: dict):
    """(the attention's input, its other keyword arguments, its output, the layer's output) of one decoder layer."""
    seen = {}

    def pre(module, args, kwargs):
        seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        seen["kw"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}

    def post(module, args, out):
        seen["y"] = out[0]

    hooks = [
        layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True),
        layer.self_attn.register_forward_hook(post),
    ]
    try:
        out = family.call_layer(layer, h, inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["x"], seen["kw"], seen["y"], out

"""The expert conversions of a mixture-of-experts teacher's block (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), and the
figures the search counts: parameters a token runs.

- ``prune_experts`` keeps ``train.keep_experts`` of each layer's E experts, those with the most routing mass on the
  block's own input sample (each token gives its top-k routing weights to the experts it picks). The router keeps
  the kept experts' rows, so a token's softmax runs over the kept ones only; top-k is clamped to what is left
  (``train.active_experts`` lowers it further).
- ``moe_to_dense`` replaces each layer's routed experts with one dense MLP of ``train.dense_width`` channels (0: top-k
  times one expert's width, the active MLP width of the teacher), as a single expert under a one-row router, whose
  softmax is exactly 1: the student keeps the family's stock classes, and runs one MLP per token. Its channels come
  from the teacher's experts (``train.dense_init``):
  - ``merge``: every expert's channels compete; channel c of expert e is scored by p_e * mean|act_{e,c}| over the
    sample, p_e being expert e's mean routing weight per token, and its down-projection column is scaled by p_e,
    so the dense MLP starts as the routing-weighted sum of the chosen channels, the expected MoE output;
  - ``top``: the most used experts whole, in order of routing mass (then by channel score), scaled alike.
  A shared expert (Qwen2-MoE) stays as it is: every token already runs it.
Ties resolve by index, deterministically. All of it runs on the block's first ``train.importance_rows`` sequences.
"""

from __future__ import annotations

import torch

from zgdata.errors import ZgError
from zgdata.families.moe import EXPERT_TENSORS
from zgdata.families.registry import family_of
from zgtrain.block.model import StudentBlock

__all__ = [
    "routing",
    "require_moe",
    "prune_experts",
    "moe_to_dense",
    "active_params",
    "idle_params",
    "teacher_active",
]


def require_moe(name: str, config):
    fam = family_of(config)
    if fam.moe is None:
        raise ZgError(
            f"the {name} conversion needs a mixture-of-experts teacher; this one ({fam.model_type}) has dense MLPs",
            key="train.conversion",
            fix="use prune_mlp to narrow a dense MLP, or teach from a Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE model",
        )
    return fam


@torch.no_grad()
def routing(block: StudentBlock, sample: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of ``block`` run on ``sample``: (the layer's MLP input (N, C), its routing weights (N, E): each
    token's top-k weights at the experts it picks, zero elsewhere)."""
    out: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(module, args, result):
        x = args[0].reshape(-1, args[0].shape[-1])
        _, scores, index = result
        dense = torch.zeros(x.shape[0], module.weight.shape[0], dtype=torch.float64)
        dense.scatter_add_(1, index, scores.double())
        out.append((x.detach(), dense))

    hooks = [layer.mlp.gate.register_forward_hook(hook) for layer in block.layers]
    try:
        block.eval()(sample.float())
    finally:
        for h in hooks:
            h.remove()
    return out


def _order(score: torch.Tensor) -> torch.Tensor:
    """Indices by descending score, ties by index (a stable sort of the negated score)."""
    return torch.sort(-score, stable=True).indices


def prune_experts(config, cfg, sample, teacher_block, layers, types) -> tuple[StudentBlock, list[dict]]:
    """(the pruned block, each layer's tensors to load into it); ``teacher_block``: the identity block."""
    fam = family_of(config)  # the conversion checked it is a mixture of experts (zgtrain/block/conversions.py)
    n_experts, k = fam.experts(config), fam.top_k(config)
    keep_n = cfg.keep_experts or max(1, n_experts // 2)
    if keep_n > n_experts:
        raise ZgError(
            f"train.keep_experts is {keep_n}, but this {fam.model_type} teacher has {n_experts} experts per layer",
            key="train.keep_experts",
            fix=f"give a count within [1, {n_experts}] (0: half, {max(1, n_experts // 2)})",
        )
    top_k = min(cfg.active_experts or k, keep_n)
    pruned = []
    for layer, (_, weights) in zip(layers, routing(teacher_block, sample)):
        keep = torch.sort(_order(weights.sum(0))[:keep_n]).values
        pruned.append(fam.prune_experts(layer, keep))
    n = len(layers)
    width = fam.width(config)
    return StudentBlock(config, [width] * n, layer_types=types, experts=[keep_n] * n, top_k=[top_k] * n), pruned


def _expert_scores(layer: dict, x: torch.Tensor, act_fn) -> torch.Tensor:
    """(E, I) mean |activation| of every channel of every expert over the tokens ``x`` (N, C)."""
    up = layer["mlp.experts.gate_up_proj"].float()
    half = up.shape[1] // 2
    rows = []
    for e in range(up.shape[0]):
        h = x @ up[e].T
        rows.append((act_fn(h[:, :half]) * h[:, half:]).abs().double().mean(0))
    return torch.stack(rows)


def moe_to_dense(config, cfg, sample, teacher_block, layers, types) -> tuple[StudentBlock, list[dict]]:
    """(the densified block, each layer's tensors to load into it); ``teacher_block``: the identity block."""
    fam = family_of(config)  # the conversion checked it is a mixture of experts (zgtrain/block/conversions.py)
    width_e, n_experts = fam.width(config), fam.experts(config)
    width = cfg.dense_width or fam.top_k(config) * width_e
    if width > n_experts * width_e:
        raise ZgError(
            f"train.dense_width is {width}, more channels than this teacher's {n_experts} experts of {width_e} hold",
            key="train.dense_width",
            fix=f"give at most {n_experts * width_e} (0: top-k x expert width, {fam.top_k(config) * width_e})",
        )
    dense = []
    for layer, block_layer, (x, weights) in zip(layers, teacher_block.layers, routing(teacher_block, sample)):
        p = weights.mean(0)  # (E,) each expert's mean routing weight per token
        score = _expert_scores(layer, x, block_layer.mlp.experts.act_fn) * p[:, None]  # (E, I)
        if cfg.dense_init == "merge":
            flat = _order(score.flatten())[:width]
        else:  # whole experts by routing mass, each one's channels by score
            ranked = [e * width_e + _order(score[e]) for e in _order(weights.sum(0)).tolist()]
            flat = torch.cat(ranked)[:width]
        flat = torch.sort(flat).values
        e, c = flat // width_e, flat % width_e
        up, down = layer["mlp.experts.gate_up_proj"], layer["mlp.experts.down_proj"]
        gate_up = torch.cat([up[e, c], up[e, width_e + c]])  # (2W, C): gate rows, then up rows
        down_w = down[e, :, c].T * p[e].to(down.dtype)  # (C, W): each column scaled by its expert's routing weight
        one = {k: v for k, v in layer.items() if k not in EXPERT_TENSORS}
        one["mlp.experts.gate_up_proj"] = gate_up.unsqueeze(0)
        one["mlp.experts.down_proj"] = down_w.unsqueeze(0)
        one["mlp.gate.weight"] = torch.zeros_like(layer["mlp.gate.weight"][:1])  # softmax over one expert: 1
        dense.append(one)
    n = len(layers)
    return StudentBlock(config, [width] * n, layer_types=types, experts=[1] * n, top_k=[1] * n), dense


def idle_params(layers) -> int:
    """Parameters of ``layers`` a token does not run: in each routed layer, the experts its router does not pick."""
    idle = 0
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if getattr(mlp, "experts", None) is not None and hasattr(mlp, "gate"):
            n = mlp.gate.weight.shape[0]
            idle += (n - min(mlp.gate.top_k, n)) * sum(p.numel() for p in mlp.experts.parameters()) // n
    return idle


def teacher_active(tensors: dict, config) -> int:
    """Parameters a token runs through the teacher layers of a slice (``layers.{i}.*`` tensors): the experts' weights
    count top-k / E of themselves, as the router runs top-k of E."""
    fam = family_of(config)
    share = fam.top_k(config) / fam.experts(config)
    expert = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
    return sum(round(v.numel() * share) if k.endswith(expert) else v.numel() for k, v in tensors.items())


def active_params(block: StudentBlock) -> int:
    """Parameters a token runs through ``block``: all but the experts its routers do not pick (top-k of E)."""
    return sum(p.numel() for p in block.parameters()) - idle_params(block.layers)

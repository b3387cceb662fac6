"""The experts implementation zg runs mixture-of-experts layers with: transformers' grouped GEMM, each expert's group
of tokens padded with zero rows to a multiple of ``CHUNK``.

Why not transformers' own ``grouped_mm``: a matrix product's bits for one row can depend on how many rows the call
holds. On these CPUs ``F.linear`` of 1 to 7 rows takes another kernel path than 8 or more and rounds differently
(bench/moe_batch_invariance.py prints where), and an expert's group is often that small. Which tokens an expert gets
depends on the rest of the batch, so a token's boundary would depend on its batch: materialize's batch and a
block's online batch would disagree (``cached == online``, docs/concepts/guarantees.md, failed for Qwen3-MoE that way).
Padding every group to a multiple of ``CHUNK`` keeps every product in the many-row regime, where a row's result is
its own; padded rows are zero and are never read back. Measured (``python bench/moe_batch_invariance.py``: a
Mixtral-shaped block, hidden 1024, 8 experts of 2816, top 2, 256 tokens against slices of 16): 63% of the tokens
change bits under ``grouped_mm``, 65% under ``eager``, none under this, at 1.2x grouped_mm's time on 2 CPU cores. The token's top-k expert outputs are then weighted and
summed by a reshape and sum in slot order, as transformers' ``grouped_mm`` does, not by ``index_add_`` (which CUDA
runs with atomics). The cost is at most ``CHUNK - 1`` zero rows per expert per layer.

Registered in transformers' ``ExpertsInterface`` as ``EXPERTS_IMPLEMENTATION`` by ``register()``, which
zgdata/families/moe.py calls where it hands the name to transformers (``load_kwargs``, ``layer_config``), so
``from_pretrained(..., experts_implementation=...)`` and a layer's config select it. Not at import: transformers'
``integrations.moe`` loads its whole modeling stack (3-4 CPU-s), and commands that never build a model import the
family registry too (`zg data verify --lineage-only`). A student loaded outside zg runs transformers' default
instead: the same function, other rounding.
"""

from __future__ import annotations

import torch

__all__ = ["EXPERTS_IMPLEMENTATION", "CHUNK", "padded_experts_forward", "register"]

EXPERTS_IMPLEMENTATION = "zg_padded_grouped_mm"
CHUNK = 32


def padded_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """(N, C) tokens, (N, K) expert ids and routing weights -> (N, C): sum_k w_k * expert_k(token)."""
    from transformers.integrations.moe import _grouped_linear  # loaded by register(), which runs first

    n_tokens, hidden = hidden_states.shape
    top = top_k_index.shape[-1]
    experts = top_k_index.reshape(-1)  # (S,) S = N * K slots
    order = torch.argsort(experts, stable=True)  # slots grouped by expert, token order within a group
    counts = torch.bincount(experts, minlength=self.num_experts)[: self.num_experts]
    padded = (counts + CHUNK - 1) // CHUNK * CHUNK
    first = torch.cumsum(padded, 0) - padded  # each group's first row in the padded layout
    rank = torch.arange(experts.numel(), device=experts.device) - (torch.cumsum(counts, 0) - counts).repeat_interleave(
        counts
    )
    rows = first.repeat_interleave(counts) + rank  # padded row of each sorted slot
    total = int(padded.sum())
    x = hidden_states.new_zeros(total, hidden).index_put((rows,), hidden_states[order // top])
    offsets = torch.cumsum(padded, 0, dtype=torch.int32)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    h = _grouped_linear(x, up, offsets, is_transposed=self.is_transposed)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    y = _grouped_linear(h, self.down_proj, offsets, is_transposed=self.is_transposed)  # (total, C)
    out = torch.empty(experts.numel(), hidden, dtype=y.dtype, device=y.device)
    out[order] = y[rows]  # back to slot order: token-major, k-minor
    weighted = out.view(n_tokens, top, hidden) * top_k_weights.to(out.dtype).unsqueeze(-1)
    return weighted.sum(dim=1).to(hidden_states.dtype)


def register() -> str:
    """Register ``padded_experts_forward`` with transformers as ``EXPERTS_IMPLEMENTATION`` (once per process) and
    return that name, for ``experts_implementation=`` or a config's ``_experts_implementation``."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    if EXPERTS_IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(EXPERTS_IMPLEMENTATION, padded_experts_forward)
    return EXPERTS_IMPLEMENTATION

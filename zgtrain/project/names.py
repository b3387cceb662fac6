"""The names params.yaml may give `train.conversion` and `train.objective`, without torch.

Validating params (zgtrain/project/config.py, run by every command that reads params.yaml,
`zg init` and `zg pipeline` included) needs only these names, so they live here and not in
the modules that implement them: loading params never imports torch.

``CONVERSIONS`` is the one registry of conversions. Each built-in name is declared here, in the
order the docs and error messages list them; zgtrain/block/conversions.py fills in each one's
function with ``@register(name)`` when it is imported (and checks that none is left without
one), and a new conversion is one more ``@register`` there, which adds its name here too.
``OBJECTIVES`` is the one list of objectives and what each feeds and asks of a block;
zgtrain/block/objectives.py does the tensor math.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CONVERSIONS", "OBJECTIVES", "ObjectiveSpec"]

# name -> the conversion's function (None until zgtrain.block.conversions is imported)
CONVERSIONS: dict[str, Callable | None] = dict.fromkeys(
    (
        "identity",
        "reinit",
        "drop_layers",
        "prune_mlp",
        "window_attention",
        "kv_heads",
        "attn_linear",
        "linear_attention",
        "prune_experts",
        "moe_to_dense",
    )
)


@dataclass(frozen=True)
class ObjectiveSpec:
    noisy: bool
    """The block's input gets sigma * noise (from the block's own generator)."""
    anchored: bool
    """The target is the teacher's next boundary; otherwise the clean input (unanchored denoising)."""


# The one list of objectives: train.objective is validated against it.
OBJECTIVES = {
    "regress": ObjectiveSpec(noisy=False, anchored=True),
    "noisy_regress": ObjectiveSpec(noisy=True, anchored=True),
    "denoise": ObjectiveSpec(noisy=True, anchored=False),
}

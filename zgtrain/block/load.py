"""A trained block back from its folder: the student block its meta.json describes, with its checked weights.

The folder's format (meta.json, the checkpoints, the weights digest) is zgtrain/fit/checkpoint.py's; this module
builds the block's module from it, so the generic loop's room needs no model.
"""

from __future__ import annotations

from zgdata.core.paths_guard import inside
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.trust import dvc_lock as trust
from zgtrain.fit.checkpoint import check_weights, load_tensors, read_meta, reload_fix
from zgtrain.fit.rerun import rerun_of

__all__ = ["load_block"]


def load_block(layout: Layout, key: str, *, which: str = "final", lineage: bool = True):
    """(StudentBlock, meta) of a trained block: ``final`` weights or the untrained ``init`` weights. ``lineage``:
    check the folder against git's dvc.lock first (False only for a folder the running stage wrote itself)."""
    from zgdata.families.registry import config_from_dict
    from zgtrain.block.model import StudentBlock

    d = inside(layout.block_dir(key), layout.root, what=f"block {key}'s folder")  # never a folder elsewhere
    if lineage:  # an input: against git's dvc.lock, where it records the folder (meta.json's digest: below)
        trust.verify(d)
    meta, run = read_meta(d), rerun_of(d)  # a block's folder, or a variant's (VariantLayout)
    if meta is None:
        raise ZgError(
            f"block {key} has not been trained ({d / 'meta.json'} missing)", fix=f"run `dvc repro {run.stage}`"
        )
    if which == "final" and not meta.get("done"):
        raise ZgError(
            f"block {key} stopped at step {meta['step']} of {meta['config']['steps']} ({d})",
            fix=f"finish it with `{run.command}` or `dvc repro {run.stage}`",
        )
    config = config_from_dict(meta["teacher_config"])
    # no "windows": full attention; "layer_types" only where the family has several (zgdata/families/registry.py);
    # no "kv_heads": the teacher's KV heads; no "attention": every layer attends (attn_linear: "linear");
    # no "experts" / "top_k": a MoE teacher's expert counts (the expert conversions set them)
    block = StudentBlock(
        config,
        meta["intermediate_sizes"],
        meta.get("windows"),
        meta.get("layer_types"),
        meta.get("kv_heads"),
        meta.get("attention"),
        meta.get("experts"),
        meta.get("top_k"),
    )
    if which == "final":
        check_weights(d, meta)
    weights = load_tensors(d / ("model.safetensors" if which == "final" else "init.safetensors"), d)
    missing, unexpected = block.load_state_dict(weights, strict=False)
    if unexpected or any(not m.startswith("rotary_emb.") for m in missing):
        raise ZgError(f"the weights in {d} do not fit block {key}'s shape", fix=reload_fix(d))
    return block.eval(), meta

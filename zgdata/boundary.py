"""Boundary dataset identity: lineage, fingerprint and the checks that compare them."""

from __future__ import annotations

import torch
import transformers

from zgdata.capture import ATTN_IMPLEMENTATION, CAPTURE_VERSION
from zgdata.config import MaterializeConfig
from zgdata.errors import ZgError
from zgdata.hashing import fingerprint

__all__ = ["boundary_lineage", "boundary_fingerprint", "check_pair_lineage", "LINEAGE_KEYS"]

# Keys that must agree between two boundaries of one block.
LINEAGE_KEYS = ("teacher_sha256", "tokenizer_sha256", "tokens_fingerprint", "storage_dtype", "compute_dtype",
                "attn_implementation", "capture_version")


def boundary_lineage(teacher: dict, tokens: dict, layer: int, cfg: MaterializeConfig) -> dict:
    return {"teacher_sha256": teacher["weights_sha256"], "tokenizer_sha256": teacher["tokenizer_sha256"],
            "tokens_fingerprint": tokens["fingerprint"], "layer": layer, "storage_dtype": cfg.storage_dtype,
            "compute_dtype": cfg.compute_dtype, "attn_implementation": ATTN_IMPLEMENTATION,
            "capture_version": CAPTURE_VERSION}


def boundary_fingerprint(lineage: dict) -> str:
    return fingerprint("boundary", CAPTURE_VERSION, {k: lineage[k] for k in (*LINEAGE_KEYS, "layer")})


def software_versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def check_pair_lineage(name_a: str, meta_a: dict, name_b: str, meta_b: dict) -> None:
    """Refuse two boundaries that come from different teachers, tokenizers, token sets or capture settings."""
    la, lb = meta_a.get("lineage", {}), meta_b.get("lineage", {})
    for k in LINEAGE_KEYS:
        if la.get(k) != lb.get(k):
            raise ZgError(f"lineage mismatch on {k}: {name_a} has {str(la.get(k))[:16]} but {name_b} has "
                          f"{str(lb.get(k))[:16]}",
                          fix="both boundaries must come from one materialization: re-run `dvc repro materialize` "
                              "or pull both from the same commit of the producing repository")

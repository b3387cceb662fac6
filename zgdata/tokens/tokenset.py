"""Corpus -> packed token sequences in ``data/tokens.lance`` with lineage, streamed in bounded memory.

Documents (zgdata/tokens/corpus.py) are split train/heldout whole, tokenized in batches through
the teacher's fast tokenizer (zgdata/tokens/encode.py: its Rust batch API, the next batch encoded
while this one is packed; the ids of ``tok(text)``), packed into ``seq_len`` rows as they arrive
(zgdata/tokens/packing.py: ``eos`` or ``pad``) and spilled to disk per split; the seeded row caps
then pick rows from the spills into a Lance dataset written batch by batch into a
staging path and renamed into place (zgdata/tokens/store.py, which also opens and reads it). Rows: train first, then heldout; ``seq_id`` is the
row number, and every boundary dataset keeps exactly this row order.

A document longer than ``stream_bytes`` on disk (a text file, a JSONL line) is never held
whole: corpus.py reads it in chunks, it is cut into the pieces zgdata/tokens/encode.py would cut
the whole text into (zgdata/tokens/pieces.py ``stream_pieces``: same cuts, so the same ids), each piece is hashed into the
document's sha256, encoded and handed to its packer as it comes, so memory holds a few
pieces, not the document. A tokenizer that cannot be cut (``splittable``) gets the whole
text. Whatever ``stream_bytes``, ``piece_chars``, ``batch_chars`` and
``flush_tokens``, the token set is the same.

``corpus_digest`` is sha256 over sha256(id) + sha256(text) of every document in reading
order (corpus.py: sorted ids for text files; stored order for
record sources), updated as documents stream past. Keys added since streaming enter the
fingerprint and lineage only when they differ from the behaviour before them, so the
default token set keeps its fingerprint and its bytes of tokens.json.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from zgdata.config import SAMPLE_SOURCE, CorpusConfig
from zgdata.core.hashing import fingerprint, sha256_bytes
from zgdata.core.lock import locked
from zgdata.core.paths_guard import output
from zgdata.core.progress import progress as _progress
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.tokens.corpus import CorpusDigest, Doc, Walk, size, sources
from zgdata.tokens.encode import PIECE_CHARS, batch_encoder, pipelined
from zgdata.tokens.mix import Chain, chained, sample_lineage, shares
from zgdata.tokens.packing import FLUSH_TOKENS, EosPacker, PadPacker, RowSpill
from zgdata.tokens.pieces import add_streamed, cuttable
from zgdata.tokens.store import TokensResult, write_tokens

__all__ = [
    "tokenize",
    "documents",
    "heldout_documents",
    "corpus_digest",
    "TOKENS_VERSION",
    "BATCH_CHARS",
    "train_documents",
    "pack_part",
    "sample_rows",
]

TOKENS_VERSION = 1
BATCH_CHARS = 1 << 21  # characters per tokenizer call (~2 MB of text): bounds memory, keeps the batch API busy
BATCH_DOCS = 512
STREAM_BYTES = 1 << 23  # a document longer than this on disk (8 MB) is read and tokenized in pieces


def _parts(cfg: CorpusConfig) -> list[CorpusConfig]:
    """What is read one after the other: a mix's sources (each with its own held-out rule), or the corpus."""
    return cfg.parts() or [cfg]


def documents(cfg: CorpusConfig) -> Iterator[tuple[str, str]]:
    """(id, text) of every used document, in reading order (streamed: one at a time)."""
    for part in _parts(cfg):
        walk = Walk(part, sources(part))
        walk.precheck()
        for d in walk:
            yield d.id, d.text
        walk.check()


def _split_documents(cfg: CorpusConfig, heldout: bool) -> Iterator[Doc]:
    for part in _parts(cfg):
        walk = Walk(part, sources(part))
        walk.precheck()
        is_heldout = _heldout_rule(part)
        for d in walk:
            if is_heldout(d) == heldout:
                yield d
        walk.check()


def heldout_documents(cfg: CorpusConfig) -> Iterator[Doc]:
    """The held-out documents of the corpus, whole and in reading order: the ones ``tokenize`` puts in the heldout
    split (the same rule; in a mix, each source's), whatever ``corpus.max_heldout_seqs`` keeps of their rows. No
    train document."""
    return _split_documents(cfg, True)


def train_documents(cfg: CorpusConfig) -> Iterator[Doc]:
    """The train documents of the corpus, in reading order: every used document that is not held out."""
    return _split_documents(cfg, False)


def corpus_digest(docs) -> str:
    """``CorpusDigest`` of (id, text) pairs."""
    h = CorpusDigest()
    for n, t in docs:
        h.add_text(n, t)
    return h.hexdigest()


def sample_rows(n: int, k: int, seed: int) -> np.ndarray | None:
    """Sorted rows kept of ``n`` (None: all). The one O(rows) array, 8 bytes a row, only when a cap applies."""
    if k == 0 or k >= n:
        return None
    g = torch.Generator().manual_seed(seed)
    return np.sort(torch.randperm(n, generator=g)[:k].numpy())


def _heldout_rule(cfg: CorpusConfig):
    if cfg.heldout:
        held = set(cfg.heldout)
        return lambda d: d.id in held
    if cfg.heldout_field:
        values = set(cfg.heldout_values)
        return lambda d: d.field in values
    # a seeded hash of the id: the same documents whatever the order or the size of the corpus
    bound = int(cfg.heldout_fraction * 2**64)
    return lambda d: int.from_bytes(hashlib.sha256(f"{cfg.seed}:{d.id}".encode()).digest()[:8], "big") < bound


def _batches(walk: Walk, max_chars: int) -> Iterator[list[Doc]]:
    """Documents in batches of about ``max_chars`` characters; a streamed document is a batch of its own."""
    batch, chars = [], 0
    for d in walk:
        if d.stream is not None:
            if batch:
                yield batch
                batch, chars = [], 0
            yield [d]
            continue
        batch.append(d)
        chars += len(d.text)
        if chars >= max_chars or len(batch) >= BATCH_DOCS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


@locked("tokens")
def tokenize(
    cfg: CorpusConfig,
    *,
    layout: Layout = Layout(),
    progress=None,
    batch_chars: int = BATCH_CHARS,
    flush_tokens: int = FLUSH_TOKENS,
    stream_bytes: int = STREAM_BYTES,
    piece_chars: int = PIECE_CHARS,
) -> TokensResult:
    """Tokenize the corpus into data/tokens.lance + data/tokens.json (``batch_chars``, ``flush_tokens``,
    ``stream_bytes`` and ``piece_chars`` bound memory; they never change the result)."""
    from zgdata.teacher.prepare import load_tokenizer, read_teacher_json

    teacher = read_teacher_json(layout)
    max_pos = teacher["architecture"]["max_positions"]
    if cfg.seq_len > max_pos:
        raise ZgError(
            f"corpus.seq_len {cfg.seq_len} exceeds the teacher's maximum positions ({max_pos})",
            key="corpus.seq_len",
            fix=f"use seq_len <= {max_pos}",
        )
    parts = _parts(cfg)
    srcs = [sources(p) for p in parts]
    walks = [Walk(p, ss, stream_bytes=stream_bytes) for p, ss in zip(parts, srcs, strict=True)]
    for walk in walks:
        walk.precheck()
    tok = load_tokenizer(layout)  # checks hf/ against teacher.json, and the tokenizer's hash
    tok_sha = teacher["tokenizer_sha256"]
    if tok.eos_token_id is None:
        raise ZgError(
            "the teacher's tokenizer has no EOS token, which separates documents",
            fix="use a teacher whose tokenizer defines eos_token",
        )
    spill_dir = output(layout.tokens.with_name(f".{layout.tokens.name}.spill"), layout.root, what="spill folder")
    if spill_dir.is_symlink():  # never zg's (it makes a folder): removing the link leaves its target alone
        spill_dir.unlink()
    shutil.rmtree(spill_dir, ignore_errors=True)  # left by a killed run
    spill_dir.mkdir(parents=True)
    try:
        with (progress or _progress)("tokenize", sum(size(s) for ss in srcs for s in ss), unit="B") as advance:
            for walk in walks:
                walk.advance = advance
            chars = (batch_chars, piece_chars)
            if cfg.is_mix():
                return _tokenize_mix(cfg, layout, teacher, tok, walks, spill_dir, chars, flush_tokens)
            return _tokenize(cfg, layout, teacher, tok, tok_sha, walks[0], spill_dir, chars, flush_tokens)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)


def _packers(cfg, tok, spill_dir: Path, flush_tokens: int) -> dict:
    """One packer per split, each spilling its rows to ``spill_dir``."""
    pad = cfg.packing == "pad"
    packers = {}
    for split in ("train", "heldout"):
        spill = RowSpill(spill_dir / f"{split}.arrows", cfg.seq_len, with_length=pad)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        packers[split] = (
            PadPacker(
                spill,
                tok.eos_token_id,
                pad_id,
                min_tokens=int(np.ceil(cfg.pad_min_fill * cfg.seq_len)),
                flush_tokens=flush_tokens,
            )
            if pad
            else EosPacker(spill, tok.eos_token_id, flush_tokens=flush_tokens)
        )
    return packers


def _pack(cfg, tok, walk: Walk, packers: dict, chars: tuple[int, int]) -> tuple[str, str, int]:
    """Tokenize every document into its split's packer: (corpus digest, held-out ids digest, held-out documents)."""
    batch_chars, piece_chars = chars
    is_heldout = _heldout_rule(cfg)
    digest, held_ids = CorpusDigest(), hashlib.sha256()
    held_docs = 0
    # exactly tok(text, add_special_tokens=False)'s ids, via the Rust batch API
    encode, in_pieces = batch_encoder(tok), cuttable(tok)  # piece_chars: the pieces of streamed documents

    def encode_batch(b: list[Doc]):
        return None if b[0].stream is not None else encode([d.text for d in b])  # a streamed one: in add_streamed

    for batch, encoded in pipelined(_batches(walk, batch_chars), encode_batch):
        for i, d in enumerate(batch):
            held = is_heldout(d)
            packer = packers["heldout" if held else "train"]
            if encoded is None:
                text_sha = add_streamed(d, encode, in_pieces, packer, piece_chars)
            else:
                text_sha = sha256_bytes(d.text.encode())
                packer.add(d.id, encoded[i])
            digest.add(d.id, text_sha)
            if held:
                held_docs += 1
                held_ids.update(sha256_bytes(d.id.encode()).encode())
    walk.check()
    if walk.documents == 0:
        raise ZgError(
            f"the corpus has no non-empty document ({walk.empty_count} empty)",
            key="corpus.source",
            fix="add documents with text",
        )
    return digest.hexdigest(), held_ids.hexdigest(), held_docs


def _finish(cfg, packers: dict) -> dict:
    """Each split's spilled rows; a split without one whole sequence is an error."""
    spills = {split: p.finish() for split, p in packers.items()}
    for split, s in spills.items():
        if s.rows == 0:
            dropped = f"; pad packing dropped {packers[split].dropped_rows} short rows" if cfg.packing == "pad" else ""
            raise ZgError(
                f"the {split} split has {packers[split].dropped_tokens} tokens, fewer than one sequence of "
                f"corpus.seq_len={cfg.seq_len}{dropped}",
                key="corpus.seq_len",
                fix="add text, hold out other documents, or lower corpus.seq_len",
            )
    return spills


def _split_spec(cfg, held_ids_hex: str) -> dict:
    """What decides the train/heldout split and the row caps: part of the token set's fingerprint."""
    spec = {
        "heldout": sorted(cfg.heldout),
        "documents": sorted(cfg.documents),
        "max_train_seqs": cfg.max_train_seqs,
        "max_heldout_seqs": cfg.max_heldout_seqs,
        "seed": cfg.seed,
    }
    if cfg.heldout_field:  # which documents the field selects is data, not params: hash their ids too
        spec.update(
            heldout_field=cfg.heldout_field, heldout_values=sorted(cfg.heldout_values), heldout_ids_sha256=held_ids_hex
        )
    if cfg.heldout_fraction:
        spec.update(heldout_fraction=cfg.heldout_fraction)
    return spec


def _lineage(
    cfg, teacher, tok_sha: str, walk: Walk, digest_hex: str, split_spec: dict, held_docs: int, packers: dict
) -> dict:
    lineage = {
        "corpus_digest": digest_hex,
        "tokenizer_sha256": tok_sha,
        "teacher_sha256": teacher["weights_sha256"],
        "seq_len": cfg.seq_len,
        "split": split_spec,
        "tokens_version": TOKENS_VERSION,
        "documents": walk.documents,
    }
    if any(s.format != "text" for s in walk.srcs):
        lineage["order"] = "stored"
    if walk.empty_count:
        lineage["empty_documents"] = walk.empty_count
    if not cfg.heldout:
        lineage["heldout_documents"] = held_docs
    if cfg.packing == "pad":
        lineage["packing"] = {
            "mode": "pad",
            "min_fill": cfg.pad_min_fill,
            "dropped_rows": {s: p.dropped_rows for s, p in packers.items()},
        }
    return lineage


def pack_part(cfg, tok, walk: Walk, spill_dir: Path, chars: tuple[int, int], flush_tokens: int) -> dict:
    """One source of a mix tokenized into its own spills: its digests, held-out documents and spilled rows."""
    spill_dir.mkdir(parents=True, exist_ok=True)
    packers = _packers(cfg, tok, spill_dir, flush_tokens)
    digest_hex, held_ids_hex, held_docs = _pack(cfg, tok, walk, packers, chars)
    spills = {split: p.finish() for split, p in packers.items()}
    return {"digest": digest_hex, "split": _split_spec(cfg, held_ids_hex), "held_docs": held_docs, "spills": spills}


def _tokenize_mix(cfg, layout, teacher, tok, walks: list[Walk], spill_dir: Path, chars, flush_tokens: int):
    """A mix (zgdata/tokens/mix.py): each source packed on its own, train rows shared by weight, held-out rows of
    every source kept held out."""
    parts = cfg.parts()
    packed = [
        pack_part(p, tok, w, spill_dir / f"part{p.index}", chars, flush_tokens)
        for p, w in zip(parts, walks, strict=True)
    ]
    train = [x["spills"]["train"] for x in packed]
    names = [f"{i} ({p.source})" for i, p in enumerate(parts)]
    counts = shares([p.weight for p in parts], [t.rows for t in train], cfg.max_train_seqs, names)
    picked = [
        np.empty(0, np.int64) if n == 0 else sample_rows(t.rows, n, cfg.seed)
        for t, n in zip(train, counts, strict=True)
    ]
    spills = {"train": Chain(train), "heldout": Chain([x["spills"]["heldout"] for x in packed])}
    keep = {
        "train": chained([t.rows for t in train], picked),
        "heldout": sample_rows(spills["heldout"].rows, cfg.max_heldout_seqs, cfg.seed),
    }
    for split, n in (("train", len(keep["train"])), ("heldout", spills["heldout"].rows)):
        if n == 0:
            raise ZgError(
                f"the mix's {split} split has no sequence of corpus.seq_len={cfg.seq_len} tokens",
                key="corpus.source",
                fix="give the sources more text or hold out other documents, or lower corpus.seq_len",
            )
    mix = []
    for p, x, n in zip(parts, packed, counts, strict=True):
        entry = {"corpus_digest": x["digest"], "split": x["split"], "weight": p.weight, "train_rows": n}
        if p.source == SAMPLE_SOURCE:
            entry["sample"] = sample_lineage(layout, teacher)
        mix.append(entry)
    split = {"max_train_seqs": cfg.max_train_seqs, "max_heldout_seqs": cfg.max_heldout_seqs, "seed": cfg.seed}
    inputs = {"mix": mix, "tokenizer_sha256": teacher["tokenizer_sha256"], "seq_len": cfg.seq_len, "split": split}
    fp = fingerprint("tokens", TOKENS_VERSION, inputs)
    for entry, p, x, w in zip(mix, parts, packed, walks, strict=True):
        entry.update(source=p.source, documents=w.documents, heldout_documents=x["held_docs"])
        entry["rows"] = {s: sp.rows for s, sp in x["spills"].items()}
    lineage = {
        "corpus_digest": sha256_bytes(json.dumps([m["corpus_digest"] for m in mix]).encode()),
        "tokenizer_sha256": teacher["tokenizer_sha256"],
        "teacher_sha256": teacher["weights_sha256"],
        "seq_len": cfg.seq_len,
        "split": split,
        "tokens_version": TOKENS_VERSION,
        "documents": sum(w.documents for w in walks),
        "order": "stored",
        "mix": mix,
    }
    empty = sum(w.empty_count for w in walks)
    if empty:
        lineage["empty_documents"] = empty
    return write_tokens(layout, cfg, fp, lineage, spills, keep)


def _tokenize(
    cfg, layout, teacher, tok, tok_sha, walk: Walk, spill_dir: Path, chars: tuple[int, int], flush_tokens: int
) -> TokensResult:
    pad = cfg.packing == "pad"
    # a sample of this teacher only, checked before any document is read (as a mix's sample is), and recorded
    sample = sample_lineage(layout, teacher) if cfg.uses_sample() else None
    packers = _packers(cfg, tok, spill_dir, flush_tokens)
    digest_hex, held_ids_hex, held_docs = _pack(cfg, tok, walk, packers, chars)
    spills = _finish(cfg, packers)
    split_spec = _split_spec(cfg, held_ids_hex)
    inputs = {"corpus_digest": digest_hex, "tokenizer_sha256": tok_sha, "seq_len": cfg.seq_len, "split": split_spec}
    if pad:
        inputs["packing"] = {"mode": "pad", "min_fill": cfg.pad_min_fill}
    fp = fingerprint("tokens", TOKENS_VERSION, inputs)

    keep = {
        "train": sample_rows(spills["train"].rows, cfg.max_train_seqs, cfg.seed),
        "heldout": sample_rows(spills["heldout"].rows, cfg.max_heldout_seqs, cfg.seed),
    }
    lineage = _lineage(cfg, teacher, tok_sha, walk, digest_hex, split_spec, held_docs, packers)
    if sample is not None:
        lineage["sample"] = sample
    return write_tokens(layout, cfg, fp, lineage, spills, keep)

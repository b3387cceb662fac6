"""Corpus -> packed token sequences in ``data/tokens.lance`` with lineage, streamed in bounded memory.

Documents (zgdata/tokens/corpus.py) are split train/heldout whole, tokenized in batches through
the teacher's fast tokenizer (zgdata/tokens/encode.py: its Rust batch API, the next batch encoded
while this one is packed; the ids of ``tok(text)``), packed into ``seq_len`` rows as they arrive
(zgdata/tokens/packing.py: ``eos`` or ``pad``) and spilled to disk per split; the seeded row caps
then pick rows from the spills into a Lance dataset written batch by batch into a
staging path and renamed into place. Rows: train first, then heldout; ``seq_id`` is the
row number, and every boundary dataset keeps exactly this row order.

A document longer than ``stream_bytes`` on disk (a text file, a JSONL line) is never held
whole: corpus.py reads it in chunks, it is cut into the pieces zgdata/tokens/encode.py would cut
the whole text into (``_pieces``: same cuts, so the same ids), each piece is hashed into the
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
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.config import SAMPLE_SOURCE, CorpusConfig
from zgdata.core.atomic import atomic_path, write_json
from zgdata.core.hashing import fingerprint, sha256_bytes
from zgdata.core.lock import locked
from zgdata.core.paths_guard import output
from zgdata.core.progress import progress as _progress
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.store.lance_io import encode_meta, open_dataset, schema_meta
from zgdata.tokens.corpus import CorpusDigest, Doc, Walk, size, sources
from zgdata.tokens.encode import PIECE_CHARS, batch_encoder, pipelined, plain_backend, splittable
from zgdata.tokens.mix import Chain, chained, sample_lineage, shares
from zgdata.tokens.packing import FLUSH_TOKENS, EosPacker, PadPacker, RowSpill

__all__ = [
    "tokenize",
    "TokensResult",
    "documents",
    "heldout_documents",
    "corpus_digest",
    "tokens_meta",
    "open_tokens",
    "read_tokens",
    "TOKENS_VERSION",
    "BATCH_CHARS",
    "train_documents",
    "pack_part",
    "write_tokens",
    "sample_rows",
]

TOKENS_VERSION = 1
BATCH_CHARS = 1 << 21  # characters per tokenizer call (~2 MB of text): bounds memory, keeps the batch API busy
BATCH_DOCS = 512
STREAM_BYTES = 1 << 23  # a document longer than this on disk (8 MB) is read and tokenized in pieces


@dataclass(kw_only=True, frozen=True)
class TokensResult:
    path: Path
    fingerprint: str
    rows: dict
    tokens: dict
    documents: int = 0
    empty_documents: int = 0


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


_CUT = re.compile(r"[!-~][ \n]")  # encode.py's cut: before a space or newline that follows an ASCII non-space


def _pieces(chunks: Iterable[str], limit: int) -> Iterator[str]:
    """The pieces ``zgdata.tokens.encode.pieces(text, limit)`` gives, of the text the chunks make up, read as they come:
    about ``limit`` characters buffered, more only while no cut is in sight."""
    it, buf, done = iter(chunks), "", False
    while True:
        while not done and len(buf) <= limit:  # the rest fits, or a cut at or before the limit is in sight
            nxt = next(it, None)
            done = nxt is None
            buf += nxt or ""
        if len(buf) <= limit:
            if buf:
                yield buf
            return
        cut = next((i for i in range(limit, 0, -1) if buf[i] in " \n" and "!" <= buf[i - 1] <= "~"), 0)
        scanned = limit
        while not cut:  # none before the limit: the first after it, reading on as long as there is none
            m = _CUT.search(buf, scanned)
            if m is not None:
                cut = m.start() + 1
            elif done:
                cut = len(buf)
            else:
                scanned = max(limit, len(buf) - 1)
                nxt = next(it, None)
                done = nxt is None
                buf += nxt or ""
        yield buf[:cut]
        buf = buf[cut:]


def _cuttable(tok) -> bool:
    """Whether ``batch_encoder(tok)`` encodes a long text in pieces (so its pieces may be encoded one by one)."""
    backend = plain_backend(tok)
    return backend is not None and splittable(backend)


def _add_streamed(d: Doc, encode, cuttable: bool, packer, piece_chars: int) -> str:
    """A streamed document into ``packer``, piece by piece (the next piece encoded while this one is packed);
    returns sha256(text) (hex)."""
    h = hashlib.sha256()
    if not cuttable:  # one call on the whole text
        text = d.text or "".join(d.chunks())
        for i in range(0, len(text), piece_chars):
            h.update(text[i : i + piece_chars].encode())
        packer.add(d.id, encode([text])[0])
        return h.hexdigest()
    first = True
    for piece, (ids,) in pipelined(_pieces(d.chunks(), piece_chars), lambda p: encode([p])):
        h.update(piece.encode())
        packer.add(d.id, ids, first=first, last=False)
        first = False
    packer.add(d.id, np.empty(0, np.int32), first=first, last=True)
    return h.hexdigest()


def _pack(cfg, tok, walk: Walk, packers: dict, chars: tuple[int, int]) -> tuple[str, str, int]:
    """Tokenize every document into its split's packer: (corpus digest, held-out ids digest, held-out documents)."""
    batch_chars, piece_chars = chars
    is_heldout = _heldout_rule(cfg)
    digest, held_ids = CorpusDigest(), hashlib.sha256()
    held_docs = 0
    # exactly tok(text, add_special_tokens=False)'s ids, via the Rust batch API
    encode, cuttable = batch_encoder(tok), _cuttable(tok)  # piece_chars: the pieces of streamed documents

    def encode_batch(b: list[Doc]):
        return None if b[0].stream is not None else encode([d.text for d in b])  # a streamed one: in _add_streamed

    for batch, encoded in pipelined(_batches(walk, batch_chars), encode_batch):
        for i, d in enumerate(batch):
            held = is_heldout(d)
            packer = packers["heldout" if held else "train"]
            if encoded is None:
                text_sha = _add_streamed(d, encode, cuttable, packer, piece_chars)
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


def write_tokens(layout: Layout, cfg, fp: str, lineage: dict, spills: dict, keep: dict) -> TokensResult:
    """data/tokens.lance (``keep``: each split's kept rows of ``spills``, None for all) and data/tokens.json."""
    pad = cfg.packing == "pad"
    rows = {s: spills[s].rows if keep[s] is None else len(keep[s]) for s in spills}
    tokens = {s: int(rows[s] * cfg.seq_len) for s in spills}
    meta = {"kind": "tokens", "fingerprint": fp, "lineage": lineage, "rows": rows, "complete": True}
    fields = [
        pa.field("seq_id", pa.int64()),
        pa.field("split", pa.string()),
        pa.field("doc", pa.string()),
        pa.field("input_ids", pa.list_(pa.int32(), cfg.seq_len)),
    ]
    if pad:
        fields.append(pa.field("length", pa.int32()))
    schema = pa.schema(fields, metadata=encode_meta(meta))
    real = {}
    layout.tokens_json.unlink(missing_ok=True)  # until both are written, the pair is absent, never mismatched
    _write_atomic(
        pa.RecordBatchReader.from_batches(schema, _kept_rows(spills, keep, schema, real)),
        layout.tokens,
        message=f"tokens {fp[:12]}: {rows}",
    )
    if pad:
        lineage["packing"]["real_tokens"] = real
    write_json(layout.tokens_json, {"fingerprint": fp, "rows": rows, "tokens": tokens, "lineage": lineage})
    return TokensResult(
        path=layout.tokens,
        fingerprint=fp,
        rows=rows,
        tokens=tokens,
        documents=lineage["documents"],
        empty_documents=lineage.get("empty_documents", 0),
    )


def _tokenize(
    cfg, layout, teacher, tok, tok_sha, walk: Walk, spill_dir: Path, chars: tuple[int, int], flush_tokens: int
) -> TokensResult:
    pad = cfg.packing == "pad"
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
    return write_tokens(layout, cfg, fp, lineage, spills, keep)


def _kept_rows(spills: dict[str, RowSpill], keep: dict[str, np.ndarray | None], schema: pa.Schema, real: dict):
    """The final rows, batch by batch: train then heldout, each split's kept rows in order, numbered.
    ``real`` receives the kept rows' real (unpadded) tokens per split when rows carry a length."""
    seq_id = 0
    for split in ("train", "heldout"):
        real[split] = 0
        sel, start = keep[split], 0
        for b in spills[split].batches():
            if sel is not None:
                lo, hi = np.searchsorted(sel, [start, start + b.num_rows])
                idx, start = sel[lo:hi] - start, start + b.num_rows
                if len(idx) == 0:
                    continue
                b = b.take(pa.array(idx))
            n = b.num_rows
            if "length" in b.schema.names:
                real[split] += int(np.asarray(b.column("length")).sum())
            cols = [
                pa.array(np.arange(seq_id, seq_id + n, dtype=np.int64)),
                pa.array([split] * n, pa.string()),
                *b.columns,
            ]
            seq_id += n
            yield pa.RecordBatch.from_arrays(cols, schema=schema)


def _write_atomic(data, path: Path, *, message: str) -> None:
    """Write next to ``path`` and rename, so a crash never leaves a half-written dataset there."""
    import lance

    with atomic_path(path) as tmp:
        lance.write_dataset(data, str(tmp), mode="create", transaction_properties={"zg.message": message})


def tokens_meta(layout: Layout = Layout()) -> dict:
    """The token dataset's own ``zg.*`` metadata (its lineage record is data/tokens.json: zgdata.lineage)."""
    return schema_meta(open_tokens(layout).schema)


def open_tokens(layout: Layout = Layout()):
    """data/tokens.lance, checked to be the token set data/tokens.json describes."""
    from zgdata.lineage import check, read_tokens_json
    from zgdata.trust import dvc_lock as trust

    trust.verify(layout.tokens, layout.tokens_json)
    ds = open_dataset(layout.tokens, kind="tokens")
    check(
        str(layout.tokens_json),
        read_tokens_json(layout),
        str(layout.tokens),
        schema_meta(ds.schema),
        keys=("fingerprint",),
        fix="restore both from one commit (`dvc checkout data/tokens.lance data/tokens.json`) "
        "or re-run `dvc repro tokens`",
    )
    return ds


def read_tokens(
    layout: Layout, rows: np.ndarray | list[int] | None = None, *, ds=None
) -> tuple[torch.Tensor, list[str]]:
    """(N, T) int64 input ids and splits of the given row numbers (all rows if None)."""
    ds = ds if ds is not None else open_tokens(layout)
    table = (
        ds.to_table(columns=["input_ids", "split"])
        if rows is None
        else ds.take(np.asarray(rows, dtype=np.int64), columns=["input_ids", "split"])
    )
    col = table.column("input_ids").combine_chunks()
    ids = torch.from_numpy(col.values.to_numpy().astype(np.int64)).reshape(len(table), -1)
    return ids, table.column("split").to_pylist()

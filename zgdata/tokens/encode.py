"""Texts -> token ids in batches, exactly the ids ``tok(text, add_special_tokens=False)`` gives, but faster.

Why this module: tokenization spends ~90% of its time in the tokenizer's Rust code.
transformers' ``__call__`` reaches it through ``Tokenizer.encode_batch``, which also computes
character offsets, and then converts every ``Encoding`` into a ``BatchEncoding``.
``Tokenizer.encode_batch_fast`` is the same Rust pipeline (added-token split, normalizer,
pre-tokenizer, model, post-processor) without the offsets: the same ids, less work (and the
model's word cache is enlarged, see ``CACHE_WORDS``). It is
called with the backend set up the way transformers sets it up for that call (no
truncation, no padding, ``encode_special_tokens`` = the tokenizer's ``split_special_tokens``).
A tokenizer class that overrides the encoding path (transformers has a few) gets the plain
``tok(...)`` call instead: the fast path is taken only where it provably is the same call.

A long document is encoded in pieces of at most ``PIECE_CHARS`` characters (``pieces``), so that the Rust
call's per-token working memory (its ``Encoding`` objects) is bounded by the piece, not the document: a single 50 MB
document took 8 GB at once. The ids are exactly the whole document's where the tokenizer provably tokenizes each
pre-token on its own (``splittable``): no normalizer, a byte-level pre-tokenizer (no prefix space) with the GPT-2 split regex (or a
BPE without merges, whose ids are one per byte), and no added token with whitespace in it or stripping whitespace
beside it. Cuts fall only between an ASCII non-space character and a space or newline, which every alternative of
that regex separates (whitespace only ever starts a pre-token or makes up one), so the pieces' pre-tokens are the
document's. Any other tokenizer (a Metaspace/SentencePiece one, a byte-level one without the regex, whose whole
document is one pre-token) gets the whole document in one call: exact, with memory that grows with it.

``pipelined`` overlaps the Rust call for the next batch (it releases the GIL) with the
Python work on the current one (reading, hashing, packing, spilling); order is kept and one
batch is encoded ahead, so memory stays bounded by the batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

__all__ = [
    "batch_encoder",
    "reference_encoder",
    "plain_backend",
    "pipelined",
    "pieces",
    "splittable",
    "CACHE_WORDS",
    "PIECE_CHARS",
]

# Words whose BPE merges the model memoizes (tokenizers' default: 10 000). The cache is pure memoization (a word's
# tokens never depend on it), so a larger one changes speed only: ~20% less tokenizer time on the plays, whose
# distinct words outgrow 10 000. Memory stays bounded: at most ~50 MB more when full.
CACHE_WORDS = 1 << 17
PIECE_CHARS = 1 << 20  # characters per piece of a long document (and per Rust call on pieces)
T = TypeVar("T")
Encode = Callable[[list[str]], list[np.ndarray]]


def reference_encoder(tok) -> Encode:
    """texts -> int32 ids through transformers' own call (the definition the fast path must match)."""

    def encode(texts: list[str]) -> list[np.ndarray]:
        out = tok(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)
        return [np.asarray(x, dtype=np.int32) for x in out["input_ids"]]

    return encode


def plain_backend(tok):
    """The Rust tokenizer behind ``tok`` when ``tok(texts)`` is nothing but its ``encode_batch``; else None."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: take the reference call
        return None
    cls = type(tok)
    if not isinstance(tok, TokenizersBackend) or cls.__call__ is not PreTrainedTokenizerBase.__call__:
        return None
    for name in (
        "_encode_plus",
        "set_truncation_and_padding",
        "_get_padding_truncation_strategies",
        "_call_one",
        "_switch_to_input_mode",
    ):
        if getattr(cls, name, None) is not getattr(TokenizersBackend, name, None):
            return None
    backend = getattr(tok, "_tokenizer", None)
    return backend if backend is not None and hasattr(backend, "encode_batch_fast") else None


def splittable(backend) -> bool:
    """True when ``backend`` tokenizes each pre-token on its own and its pre-tokens never span a cut of ``pieces``."""
    import json

    d = json.loads(backend.to_str())
    pre, model = d.get("pre_tokenizer") or {}, d.get("model") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    if d.get("normalizer") is not None or not byte_level or model.get("type") != "BPE":
        return False
    if any(p.get("type") not in ("ByteLevel", "Digits") for p in parts) or any(
        p.get("add_prefix_space") for p in byte_level
    ):
        return False
    if not all(p.get("use_regex", True) for p in byte_level) and model.get("merges"):
        return False  # no regex: the whole document is one pre-token, merged across any cut
    return not any(
        any(c.isspace() for c in t["content"]) or t.get("lstrip") or t.get("rstrip")
        for t in d.get("added_tokens") or []
    )


def _cut(text: str, start: int, limit: int) -> int:
    """The last cut in text[start + 1 : start + limit]: before a space or newline that follows an ASCII non-space
    character; len(text) when the rest fits; else the first cut after the limit (len(text) when there is none)."""
    end = start + limit
    if end >= len(text):
        return len(text)
    for i in range(end, start, -1):
        if text[i] in " \n" and "!" <= text[i - 1] <= "~":
            return i
    for i in range(end + 1, len(text)):
        if text[i] in " \n" and "!" <= text[i - 1] <= "~":
            return i
    return len(text)


def pieces(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of about ``limit`` characters at the boundaries described in the module docstring."""
    out, start = [], 0
    while start < len(text):
        end = _cut(text, start, limit)
        out.append(text[start:end])
        start = end
    return out or [text]


def batch_encoder(tok, *, piece_chars: int = PIECE_CHARS) -> Encode:
    """texts -> int32 ids, equal to ``reference_encoder(tok)``'s, through ``encode_batch_fast`` where that is the
    same call; a text longer than ``piece_chars`` is encoded in pieces where ``splittable``."""
    backend = plain_backend(tok)
    if backend is None:
        return reference_encoder(tok)
    split = bool(getattr(tok, "split_special_tokens", False))
    resize = getattr(backend.model, "_resize_cache", None)
    if resize is not None:
        resize(CACHE_WORDS)

    def encode(texts: list[str]) -> list[np.ndarray]:
        # what transformers' _encode_plus does before its encode_batch, redone per call as it does
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
        if backend.encode_special_tokens != split:
            backend.encode_special_tokens = split
        if not can_split or all(len(t) <= piece_chars for t in texts):
            return [np.array(e.ids, dtype=np.int32) for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
        return _in_pieces(backend, texts, piece_chars)

    can_split = splittable(backend)
    return encode


def _in_pieces(backend, texts: list[str], piece_chars: int) -> list[np.ndarray]:
    """Each text's ids, from Rust calls on at most about ``piece_chars`` characters of pieces each (cut as they are
    encoded: no copy of a whole document is made)."""
    ids: list[list[np.ndarray]] = [[] for _ in texts]
    group, owners, chars = [], [], 0

    def flush():
        for k, e in zip(owners, backend.encode_batch_fast(group, add_special_tokens=False)):
            ids[k].append(np.array(e.ids, dtype=np.int32))
        group.clear()
        owners.clear()

    for k, t in enumerate(texts):
        start = 0
        while True:
            end = _cut(t, start, piece_chars)
            if group and chars + end - start > piece_chars:
                flush()
                chars = 0
            group.append(t[start:end])
            owners.append(k)
            chars, start = chars + end - start, end
            if start >= len(t):
                break
    if group:
        flush()
    return [np.concatenate(parts) if len(parts) != 1 else parts[0] for parts in ids]


def pipelined(batches: Iterable[T], encode: Callable[[T], list[np.ndarray]]) -> Iterator[tuple[T, list[np.ndarray]]]:
    """(batch, encode(batch)) in order, encoding the next batch in a worker thread while the caller works on this one.

    While the caller works on batch k, batch k+1 is being encoded and batch k+2 read: three batches in memory at
    most. An exception from ``encode`` is raised at its
    batch; one from ``batches`` (a bad record) as soon as reading meets it."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="zg-encode") as pool:
        pending = []
        try:
            for b in batches:
                pending.append((b, pool.submit(encode, b)))
                if len(pending) == 2:
                    b0, f0 = pending.pop(0)
                    yield b0, f0.result()
            while pending:
                b0, f0 = pending.pop(0)
                yield b0, f0.result()
        finally:
            for _, f in pending:  # a failure or an abandoned generator: do not encode what nobody reads
                f.cancel()

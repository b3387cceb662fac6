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

``pipelined`` overlaps the Rust call for the next batch (it releases the GIL) with the
Python work on the current one (reading, hashing, packing, spilling); order is kept and one
batch is encoded ahead, so memory stays bounded by the batch size.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

__all__ = ["batch_encoder", "reference_encoder", "plain_backend", "pipelined", "CACHE_WORDS"]

# Words whose BPE merges the model memoizes (tokenizers' default: 10 000). The cache is pure memoization (a word's
# tokens never depend on it), so a larger one changes speed only: ~20% less tokenizer time on the plays, whose
# distinct words outgrow 10 000. Memory stays bounded: at most ~50 MB more when full.
CACHE_WORDS = 1 << 17
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
    for name in ("_encode_plus", "set_truncation_and_padding", "_get_padding_truncation_strategies", "_call_one",
                 "_switch_to_input_mode"):
        if getattr(cls, name, None) is not getattr(TokenizersBackend, name, None):
            return None
    backend = getattr(tok, "_tokenizer", None)
    return backend if backend is not None and hasattr(backend, "encode_batch_fast") else None


def batch_encoder(tok) -> Encode:
    """texts -> int32 ids, equal to ``reference_encoder(tok)``'s, through ``encode_batch_fast`` where that is the
    same call."""
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
        return [np.array(e.ids, dtype=np.int32) for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return encode


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

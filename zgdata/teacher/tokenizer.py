"""Tokenizer identity and the tiny built-in byte-level tokenizer (no hub needed)."""

from __future__ import annotations

import json

from zgdata.core.hashing import canonical_json, sha256_bytes

__all__ = ["tokenizer_sha256", "byte_level_tokenizer", "check_vocab"]


def tokenizer_sha256(tok) -> str:
    """Hash of the tokenizer's full definition (model, merges, normalizers, special tokens)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        from zgdata.errors import ZgError

        raise ZgError(
            f"tokenizer {type(tok).__name__} has no fast backend to hash",
            fix="use a teacher whose tokenizer has a tokenizer.json (fast tokenizer)",
        )
    spec = json.loads(backend.to_str())
    specials = {k: str(v) for k, v in sorted(tok.special_tokens_map.items())}
    payload = {"backend": spec, "specials": specials}
    if getattr(tok, "split_special_tokens", False):  # encodes special tokens' text as plain text: other ids
        payload["split_special_tokens"] = True  # only when set, so every other tokenizer keeps its digest
    return sha256_bytes(canonical_json(payload).encode())


def check_vocab(tok, vocab_size: int) -> None:
    """Refuse a tokenizer that can give ids the model has no embedding row for (e.g. a ``<pad>`` added to the
    tokenizer without resizing the embeddings): tokenize would accept them and the teacher's forward would fail."""
    over = sorted((i, t) for t, i in tok.get_vocab().items() if i >= vocab_size) if len(tok) > vocab_size else []
    if over:
        from zgdata.errors import ZgError

        shown = ", ".join(f"{t!r} ({i})" for i, t in over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5 else "")
        raise ZgError(
            f"the tokenizer has {len(tok)} tokens but the model embeds only {vocab_size}: ids {shown} have no "
            f"embedding row",
            key="teacher.source",
            fix="resize the model's embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer))) and "
            "save it again, or remove the added tokens from the tokenizer",
        )


def byte_level_tokenizer():
    """A 257-token byte-level tokenizer built in code: 256 bytes plus <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=1 << 30,
    )

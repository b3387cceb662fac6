"""Long documents are read, tokenized and packed in pieces (zgdata/tokens/corpus.py Stream, pieces.py
stream_pieces, packing.py add(first=, last=)), and the token set is exactly the one the whole-text path gives.

Memory claims live in bench/tokenize_corpus.py (bench/out/tokenize_single_doc.txt); here only equality.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

import zgdata.tokens.corpus as corpus
import zgdata.tokens.jsonl as jsonl
from tests.helpers.datasets import token_table
from tests.helpers.projects import read_json, teacher_linked_project
from zgdata.config import CorpusConfig
from zgdata.errors import ZgError
from zgdata.tokens.corpus import Source, read
from zgdata.tokens.encode import pieces
from zgdata.tokens.packing import EosPacker, PadPacker, RowSpill
from zgdata.tokens.pieces import stream_pieces
from zgdata.tokens.tokenset import tokenize

PLAYS = (
    "ROMEO. But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\r\n"
    'Café naïve — “quoted” 東京 🙂👍🏽 ﬁ\tand  double  spaces \\ back "quote" /slash\n'
)


def _long_text() -> str:
    """~150 k characters: lines, a 6 k-character stretch with no cut (CJK), a long word, CRLF, lone CR, multi-byte."""
    return "   \n" + PLAYS * 600 + "東京大阪" * 1500 + " " + "x" * 5000 + " y" + PLAYS * 700 + "\u2028 end\r"


def _write(kind: str, where: Path) -> str:
    where.mkdir(parents=True)
    text = _long_text()
    docs = {"long": text, "short": PLAYS * 40, "other": PLAYS[::-1] * 30}
    if kind == "text":
        for name, t in docs.items():
            (where / f"{name}.txt").write_bytes(t.encode())  # bytes: the CRs stay on disk
        return str(where / "*.txt")
    recs = [{"text": docs["long"], "meta": {"n": [1, -2.5e3, None]}, "id": "long"}]
    recs += [{"id": name, "text": t} for name, t in docs.items() if name != "long"]
    lines = [json.dumps(r, ensure_ascii=i % 2 == 0) for i, r in enumerate(recs)]
    data = ("\n".join(lines) + "\n").encode()
    path = where / f"c.{kind}"
    path.write_bytes(gzip.compress(data) if kind.endswith(".gz") else data)
    return str(path)


@pytest.mark.parametrize("packing", ["eos", "pad"])
@pytest.mark.parametrize("kind", ["text", "jsonl", "jsonl.gz"])
def test_a_long_document_streamed_in_pieces_gives_the_whole_texts_token_set(tiny_built, tmp_path, kind, packing):
    source = _write(kind, tmp_path / "corpus")
    fill = {"pad_min_fill": 0.5} if packing == "pad" else {}
    cfg = CorpusConfig(source=[source], heldout=["short"], seq_len=32, packing=packing, **fill)
    whole, streamed = (
        teacher_linked_project(tiny_built, tmp_path / "whole"),
        teacher_linked_project(tiny_built, tmp_path / "streamed"),
    )
    tokenize(cfg, layout=whole, stream_bytes=1 << 30)  # read whole, and one tokenizer call (under PIECE_CHARS)
    docs = list(corpus.Walk(cfg, corpus.sources(cfg), stream_bytes=2000))
    assert sorted(d.id for d in docs if d.stream is not None) == ["long", "other", "short"]
    tokenize(cfg, layout=streamed, stream_bytes=2000, piece_chars=3000, flush_tokens=333)  # ~60 pieces
    a, b = token_table(whole), token_table(streamed)
    assert np.array_equal(a.pop("input_ids"), b.pop("input_ids"))
    assert a == b
    assert read_json(whole.tokens_json) == read_json(streamed.tokens_json)


def test_streamed_pieces_are_the_pieces_of_the_whole_text():
    rng = random.Random(0)
    alphabet = ["a", "b", " ", "\n", "東", "xy ", "  ", ".", "\t", "🙂"]
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) * rng.choice([1, 1, 5, 40]) for _ in range(rng.randrange(1, 300)))
        limit = rng.choice([1, 2, 3, 7, 16, 50])
        chunks, i = [], 0
        while i < len(text):
            n = rng.randrange(1, 30)
            chunks.append(text[i : i + n])
            i += n
        assert list(stream_pieces(iter(chunks), limit)) == pieces(text, limit)


def _packed(packer_cls, docs, parts: bool, tmp_path: Path, **kw):
    spill = RowSpill(tmp_path / f"{packer_cls.__name__}{parts}.arrows", 16, with_length=packer_cls is PadPacker)
    p = packer_cls(spill, 256, **kw)
    rng = np.random.default_rng(1)
    for name, ids in docs:
        if not parts:
            p.add(name, ids)
            continue
        cuts = np.sort(rng.integers(0, len(ids) + 1, size=int(rng.integers(0, 5))))
        for k, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(ids)])):
            p.add(name, ids[lo:hi], first=k == 0, last=hi == len(ids) and k == len(cuts))
    p.finish()
    return pa.Table.from_batches(list(spill.batches()), schema=spill.schema), p.dropped_tokens


@pytest.mark.parametrize("flush", [1, 7, 16, 10**6])
def test_a_document_packed_in_parts_gives_the_rows_of_the_whole(tmp_path, flush):
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", rng.integers(0, 250, size=int(rng.integers(0, 70))).astype(np.int32)) for i in range(50)]
    for cls, kw in ((EosPacker, {}), (PadPacker, {"pad": 257, "min_tokens": 5})):
        whole = _packed(cls, docs, False, tmp_path, flush_tokens=flush, **kw)
        parts = _packed(cls, docs, True, tmp_path, flush_tokens=flush, **kw)
        assert whole[0].equals(parts[0]) and whole[1] == parts[1]


LINES = [
    {"id": "a", "text": PLAYS * 3},
    {"text": PLAYS * 3 + "\ud83d\ude00\udbff\udfff x\\\\u", "id": "after", "n": [1, {"k": "v"}, None, True]},
    {"text": "short", "text2": PLAYS * 3, "id": 7},  # a long string that is not the text
    {"text": "first", "id": "dup", "text ": 1, "TEXT": PLAYS * 2},  # TEXT: "\u0074ext" below, the last one wins
    {"text": " \n\t " * 20, "id": "blank"},
]


@pytest.mark.parametrize("chunk", [1, 2, 5, 13, 1 << 20])
def test_a_long_jsonl_line_reads_as_json_loads_reads_it(tmp_path, monkeypatch, chunk):
    """Read in chunks of CHUNK bytes (each module that reads holds its own copy of the constant: all are set, or
    the JSONL reader went on reading 1 MiB at a time and a surrogate pair split across two reads was never met)."""
    for module in (corpus, jsonl):
        monkeypatch.setattr(module, "CHUNK", chunk)
    cfg = SimpleNamespace(text_field="text", id_field="id", heldout_field="")
    path = tmp_path / "c.jsonl"
    raw = [json.dumps(r, ensure_ascii=i % 2 == 1) for i, r in enumerate(LINES)]
    raw[1] = raw[1].replace('"id"', ' \t"id" \r')  # JSON whitespace inside
    raw[3] = raw[3].replace('"TEXT"', '"\\u0074ext"')
    path.write_text("\n".join(raw) + "\n\n  \n", encoding="utf-8")
    want = list(read(Source(path, "jsonl"), cfg))
    got = list(read(Source(path, "jsonl"), cfg, stream_bytes=40))
    assert [d.stream is not None for d in got] == [True, True, False, True, True]
    for w, g in zip(want, got):
        assert (g.id, g.where, g.field, g.blank()) == (w.id, w.where, w.field, w.blank())
        assert "".join(g.chunks()) == w.text


@pytest.mark.parametrize(
    "line",
    [
        '{"text": "%s", "id": 1,}',  # trailing comma
        '{"text": "%s\\x", "id": 1}',  # bad escape
        '{"text": "%s\\ud83", "id": 1}',
        '{"text": "%s\x01", "id": 1}',  # control character
        '{"text": "%s", "id": 1} x',  # extra data
        '\ufeff{"text": "%s"}',  # BOM
        '{"text": "%s"',  # unterminated
        '["%s"]',
        '{"text": "%s", "id": 01}',
        '{"id": "%s", "text": "a"}',  # a long id is read whole
    ],
)
def test_a_bad_long_jsonl_line_fails_as_the_whole_read_does(tmp_path, line):
    cfg = SimpleNamespace(text_field="text", id_field="id", heldout_field="")
    path = tmp_path / "c.jsonl"
    path.write_text(line % ("words " * 50) + "\n", encoding="utf-8")

    def outcome(**kw):
        try:
            return [(d.id, "".join(d.chunks())) for d in read(Source(path, "jsonl"), cfg, **kw)]
        except ZgError as e:
            return str(e)

    assert outcome(stream_bytes=40) == outcome()


def test_a_long_text_file_that_is_not_utf8_names_the_byte_the_whole_read_names(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK", 7)
    path = tmp_path / "bad.txt"
    for data in (b"ab " * 30 + "é".encode() + b"\xff" + b" cd" * 10, b"ab " * 30 + "東".encode()[:2]):
        path.write_bytes(data)
        with pytest.raises(ZgError) as whole:
            list(read(Source(path, "text"), SimpleNamespace()))
        with pytest.raises(ZgError) as streamed:
            list(read(Source(path, "text"), SimpleNamespace(), stream_bytes=10))
        assert str(streamed.value) == str(whole.value)

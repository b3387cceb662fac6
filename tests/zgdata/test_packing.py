"""One packing routine for the token set and the evaluation sets (zgdata/tokens/packing.py): ``eos`` packing
drops the tail shorter than a row for training, and keeps it as a padded last row for an eval set when it holds a
next-token target; the document digest is one class for both (zgdata/tokens/corpus.py ``CorpusDigest``)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from zgdata.tokens.corpus import CorpusDigest
from zgdata.tokens.packing import EosPacker, RowSpill, pack_eos_padded

EOS, PAD = 9, 0


def _docs(*lengths):
    """Documents of ids 1, 2, ... (each document its own run), named d0, d1, ..."""
    out, nxt = [], 1
    for i, n in enumerate(lengths):
        out.append((f"d{i}", np.arange(nxt, nxt + n, dtype=np.int32)))
        nxt += n
    return out


def _stream(docs):
    return np.concatenate([np.append(ids, EOS) for _, ids in docs])


@pytest.mark.parametrize("lengths", [(3, 4), (2, 2, 3), (7,), (1,), (5, 1)])
def test_the_padded_tail_is_kept_only_with_a_next_token_target(tmp_path, lengths):
    docs = _docs(*lengths)
    flat = _stream(docs)
    rows, lens = pack_eos_padded(iter(docs), 4, EOS, PAD, tmp_path)
    full, tail = divmod(len(flat), 4)
    assert rows.dtype == np.int64 and lens.dtype == np.int64
    assert np.array_equal(rows[:full].reshape(-1), flat[: full * 4]) and (lens[:full] == 4).all()
    if tail >= 2:  # a last row, padded on the right, its length the real tokens
        assert len(rows) == full + 1 and lens[-1] == tail
        assert np.array_equal(rows[-1], np.concatenate([flat[full * 4 :], np.full(4 - tail, PAD)]))
    else:  # no tail, or one token: no next-token target, dropped
        assert len(rows) == full


def test_without_pad_tail_the_tail_is_dropped_and_counted(tmp_path):
    packer = EosPacker(RowSpill(tmp_path / "r.arrow", 4, with_length=False), EOS)
    for name, ids in _docs(3, 3):  # 8 tokens with EOS: two rows, nothing left
        packer.add(name, ids)
    packer.add("d2", np.array([20, 21], dtype=np.int32))  # 3 more: a tail of 3
    batches = list(packer.finish().batches())
    assert sum(b.num_rows for b in batches) == 2 and packer.dropped_tokens == 3
    assert "length" not in batches[0].schema.names


def test_the_document_digest_is_sha256_of_each_ids_and_texts_sha256():
    d = CorpusDigest()
    d.add_text("a", "one")
    d.add("b", hashlib.sha256(b"two").hexdigest())  # a streamed document gives its text's sha256
    h = hashlib.sha256()
    for i, text in (("a", "one"), ("b", "two")):
        h.update(hashlib.sha256(i.encode()).hexdigest().encode() + hashlib.sha256(text.encode()).hexdigest().encode())
    assert d.hexdigest() == h.hexdigest()

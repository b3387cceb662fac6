"""Every teacher forward that makes or checks a boundary holds exactly materialize.batch_size rows
(zgdata.families.capture.capture_rows): materialize in one process, a Ray shard's task, and verify's recompute, a
short last batch padded with copies of its last row. A GPU chooses its GEMM and attention kernels per shape, so a
row's bits can depend on its forward's row count; with one row count everywhere they cannot. On the CPU they do
not depend on it at all: the boundaries captured 5 rows at a time equal those captured 8 at a time, bit for bit.
(Online targets: tests/zgtrain/block/test_train.py::test_online_targets_run_the_teacher_in_materialize_batches.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

import zgdata.families.capture as cap
from tests.helpers.copies import deferred_to_host, one_behind
from tests.helpers.datasets import boundary_bits, data_file_digest
from tests.helpers.runners import zg_main
from zgdata.config import MaterializeConfig, PartitionConfig, VerifyConfig, section
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.materialize.shard_task import run_shard
from zgdata.materialize.sharded import _base_spec
from zgdata.store import integrity
from zgdata.verify import verify

BATCH = 5  # the tiny profile's 56 rows are 11 batches of 5 and one of 1


@pytest.fixture
def forwards(monkeypatch) -> list[int]:
    """The row count of every teacher forward ``capture`` runs in this process."""
    rows, real = [], cap.capture
    monkeypatch.setattr(cap, "capture", lambda model, ids, *a, **k: rows.append(len(ids)) or real(model, ids, *a, **k))
    return rows


def _configs(root, **materialize):
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["materialize"] = {**params.get("materialize", {}), **materialize}
    return section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")


def test_materialize_and_verify_run_every_forward_at_the_batch_size(tiny_built, tiny_project, forwards):
    want = boundary_bits(tiny_built)  # captured 8 rows at a time
    shutil.rmtree(tiny_project / "data" / "boundaries")
    cfg, part = _configs(tiny_project, batch_size=BATCH)
    layout = Layout(tiny_project)
    materialize(cfg, part, layout=layout, sharded=False)
    n_rows = len(next(iter(want.values()))["seq_id"])
    assert n_rows % BATCH  # the last batch is short, and padded
    assert forwards == [BATCH] * -(-n_rows // BATCH)
    got = boundary_bits(tiny_project)
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name]["bits"], want[name]["bits"]), name

    forwards.clear()
    report = verify(VerifyConfig(sample=7), layout=layout, partition=part, mcfg=cfg)
    assert report.ok, report.failures
    assert len(report.checked_seq_ids) == 7 and forwards == [BATCH, BATCH]


def _shard(root, stage, lo: int, hi: int) -> tuple[dict, dict]:
    """Run a shard task in this process over rows [lo, hi) into ``stage``: its spec and its result."""
    layout = Layout(root)
    cfg, part = _configs(root, batch_size=BATCH)
    teacher = json.loads(layout.teacher_json.read_text())
    tokens = json.loads(layout.tokens_json.read_text())
    names = [n for n in part.names if n != "h00"]
    stage.mkdir(parents=True)
    spec = _base_spec(
        cfg,
        layout,
        stage,
        names,
        [part.layer_of(n) for n in names],
        tokens["tokens"]["train"] // tokens["rows"]["train"],  # the sequence length
        teacher["architecture"]["hidden_size"],
        integrity.WRITE_CHECKSUM,
        {"teacher_sha256": teacher["weights_sha256"], "tokens_fingerprint": tokens["fingerprint"]},
        torch.device("cpu"),
        0,
    )
    res = json.loads(run_shard(json.dumps({**spec, "lo": lo, "hi": hi})))
    assert "error" not in res, res
    return spec, res


def test_a_shard_task_runs_every_forward_at_the_batch_size(tiny_project, forwards, tmp_path):
    """A shard whose rows end mid-batch (rows 0-11 in batches of 5) pads its last forward like one process does."""
    _shard(tiny_project, tmp_path / "stage", 0, 12)
    assert forwards == [BATCH, BATCH, BATCH]


def test_a_shard_whose_copies_wait_one_batch_behind_writes_the_same_files(
    tiny_project, forwards, tmp_path, monkeypatch
):
    """The shard task's copies to the host under way until its next batch is launched (as on a GPU,
    zgdata/core/host_copy.py): the same forwards, the same stats, every data file the same bytes."""
    from zgdata.core import host_copy

    spec, want = _shard(tiny_project, tmp_path / "a", 0, 12)
    log: list = []
    monkeypatch.setattr(host_copy, "to_host", deferred_to_host(log))  # buffers filled only when waited for
    forwards.clear()
    _, got = _shard(tiny_project, stage := tmp_path / "b", 0, 12)
    assert forwards == [BATCH, BATCH, BATCH] and log == one_behind(3)
    assert got["stats"] == want["stats"]
    for name, frags in want["fragments"].items():
        files = [[d["path"] for d in f["files"]] for f in frags]
        other = [[d["path"] for d in f["files"]] for f in got["fragments"][name]]
        assert [len(f) for f in files] == [len(f) for f in other] and files, name
        for a, b in zip(sum(files, []), sum(other, [])):
            data = f"{name}.lance/data"  # the staged dataset of boundary ``name``
            assert data_file_digest(Path(spec["stage"]) / data / a) == data_file_digest(stage / data / b), name


def test_capture_rows_pads_a_short_forward_and_keeps_each_rows_bits(tiny_built):
    from zgdata.teacher.prepare import load_teacher
    from zgdata.tokens.store import read_tokens

    layout = Layout(tiny_built)
    model, _ = load_teacher(layout, dtype="float32", with_tokenizer=False, per_layer=True)
    ids, _ = read_tokens(layout, list(range(7)))
    whole = cap.capture(model, ids, [2, 4], storage_dtype=torch.bfloat16)
    got = cap.capture_rows(model, ids, [2, 4], storage_dtype=torch.bfloat16, rows=3)
    for k in (2, 4):
        assert got[k].shape == whole[k].shape
        assert torch.equal(got[k].view(torch.int16), whole[k].view(torch.int16)), k
    with pytest.raises(ValueError, match="needs rows >= 1 and at least one sequence, got rows=0, 7"):
        cap.capture_rows(model, ids, [2], storage_dtype=torch.bfloat16, rows=0)
    with pytest.raises(ValueError, match="got rows=4, 0"):
        cap.capture_rows(model, ids[:0], [2], storage_dtype=torch.bfloat16, rows=4)


def test_zg_data_verify_takes_the_batch_size_from_params_without_a_partition(tiny_project, forwards):
    """`zg data verify` in a folder whose params.yaml names no partition still recomputes in forwards of its
    materialize.batch_size rows (the virtual h00's settings are what needs the partition, not the row count)."""
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    params.pop("partition", None)
    params["materialize"] = {**params.get("materialize", {}), "batch_size": 3}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    zg_main("data", "verify", "--sample", "4", cwd=tiny_project)
    assert forwards == [3, 3]

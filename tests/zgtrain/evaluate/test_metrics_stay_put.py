"""Metrics that stay put: DVC-tracked metrics hold no wall-clock figure (zgdata/core/metrics_file.py), so a rerun
of the same work leaves each file byte-identical and unwritten, the timings go to .zg/timings/, and `dvc status`
stays clean. (`zg repro --jobs 2` ending in a serial run's whole dvc.lock: tests/zgtrain/exec/test_repro.py.)"""

from __future__ import annotations

import json

import pytest

from tests.helpers.projects import copy_project
from tests.helpers.runners import run, zg_main
from zgdata.core.metrics_file import TIMED_KEYS, read_timings, split_timed, write_metrics


@pytest.fixture
def project(reproduced, tmp_path):
    return copy_project(reproduced, tmp_path / "proj")


def test_a_rerun_of_evaluate_leaves_metrics_eval_json_byte_identical_and_unwritten(project):
    path = project / "metrics" / "eval.json"
    before, stat = path.read_bytes(), path.stat()
    assert split_timed(json.loads(before))[1] == {}  # no wall-clock figure in the tracked file
    printed = json.loads(zg_main("train", "evaluate", "--json", cwd=project).stdout)
    assert printed["seconds"] > 0  # the command's own result keeps its timing
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert read_timings(path)["seconds"] == printed["seconds"]
    assert "up to date" in run(["dvc", "status"], cwd=project).stdout


def test_a_no_op_block_rerun_writes_nothing(project):
    path = project / "metrics" / "blocks" / "b00.json"
    before, stat = path.read_bytes(), path.stat()
    printed = json.loads(zg_main("train", "block", "b00", "--json", cwd=project).stdout)
    assert printed["status"] == "done" and printed["tokens_per_s"] == read_timings(path)["tokens_per_s"]
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stat.st_mtime_ns


def test_timings_are_split_out_at_any_depth(tmp_path):
    (tmp_path / "params.yaml").write_text("seed: 0\n")  # a project root
    path = tmp_path / "metrics" / "variants" / "b00" / "p50.json"
    write_metrics(path, {"ce": 1.5, "seconds": 2.0, "training": {"tokens_per_s": 300.0, "steps": 12}})
    assert json.loads(path.read_text()) == {"ce": 1.5, "training": {"steps": 12}}
    assert read_timings(path) == {"seconds": 2.0, "training": {"tokens_per_s": 300.0}}
    assert (tmp_path / ".zg" / "timings" / "metrics" / "variants" / "b00" / "p50.json").is_file()
    assert TIMED_KEYS == {"seconds", "tokens_per_s"}

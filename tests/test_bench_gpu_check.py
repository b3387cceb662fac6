"""bench/gpu_check.py, the prepared GPU checks, runs on CPU as a smoke test: every check it can run without Ray
(materialize against the forward, cached == online training of b00, the write path, a MoE block's batch invariance)
passes on the tiny project."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.projects import read_json
from tests.helpers.runners import run
from zgdata.core.runtime import cores

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check(*args, tmp_path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--workdir", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "ZG_DEVICE": "cpu", **(env or {})},
        timeout=600,
    )


@pytest.mark.long
def test_gpu_check_smoke_run_on_cpu(tiny_built, tmp_path):
    r = _gpu_check("--smoke", "--project", str(tiny_built), tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["device"] == "cpu" and res["failed"] == []
    assert res["cached_equals_online"] is True
    assert res["verify_ok"] is True and res["verify_failures"] == 0  # `zg data verify` in the project, 8 rows
    assert res["materialize_tok_s"] > 0 and res["write_path_gbps"] > 0 and res["write_path_blob_gbps"] > 0
    # the forward with its boundaries left on the device measured; on the CPU there is no copy to wait for
    assert res["forward_on_device_tok_s"] > 0 and res["to_host_wait_s"] == 0.0
    assert res["write_path_raw_gbps"] > 0 and res["write_path_zstd_fast_gbps"] > 0
    assert res["loader_first_epoch_gbps"] > 0 and res["loader_first_epoch_ratio"] > 0  # the loader on this box's cores
    # and from the disk: the pair's files dropped from the page cache (posix_fadvise), or, on a tmpfs, no ratio
    left, ratio = res["loader_disk_resident"], res["loader_first_epoch_from_disk_ratio"]
    assert (left <= 0.05 and ratio > 0) or (left > 0.05 and math.isnan(ratio))
    assert res["moe_batch_invariant"] is True and res["moe_zg_padded_grouped_mm_tokens_changed"] == 0.0
    # the copies check ran (on the CPU nothing races or overlaps: a GPU gives these figures their meaning)
    assert {f"copies_{k}_exact" for k in ("to_host", "to_device", "kept")} <= set(res)
    assert {f"overlap_{k}_speedup" for k in ("materialize_overlap", "training_overlap")} <= set(res)
    assert res["moe_batch_invariant_fp32"] is True and res["moe_padded_fp32_tokens_changed"] == 0.0


@pytest.mark.long
def test_gpu_check_builds_a_teacher_at_an_8b_layer_shape(tmp_path):
    """--teacher-shape: a teacher of random weights at Llama-3.1-8B's layer shape (in the smoke run, the same code at
    a CPU's size) goes through `zg teacher prepare`, tokenize and materialize under `dvc repro`, with a boundary
    every 4 layers (h00 recomputed, not stored), and the materialize check measures it and counts the stored
    boundaries. Nothing is downloaded."""
    r = _gpu_check("--smoke", "--teacher-shape", "llama-3.1-8b", "--checks", "materialize", tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["failed"] == [] and res["materialize_tok_s"] > 0 and res["forward_tok_s"] > 0
    assert res["hidden"] == 128 and res["boundaries"] == 2  # the smoke shape; h04 and h08 stored (h00 virtual)
    proj = tmp_path / "work" / "proj"
    arch = read_json(proj / "models" / "teacher" / "teacher.json")["architecture"]
    assert (arch["model_type"], arch["num_layers"], arch["num_heads"], arch["num_kv_heads"]) == ("llama", 8, 4, 1)
    assert sorted(p.name for p in (proj / "data" / "boundaries").glob("h*.lance")) == [
        "h04.lance",
        "h08.lance",
    ]
    params = yaml.safe_load((proj / "params.yaml").read_text())
    assert params["teacher"]["source"] == str(tmp_path / "work" / "teacher-llama-3.1-8b-8-smoke")
    assert json.loads(run(["dvc", "status", "--json", "materialize"], cwd=proj).stdout or "{}") == {}


def test_without_git_the_project_checks_fail_by_name_and_the_others_still_run(tmp_path):
    """A GPU image without git: `zg init` and DVC cannot run, so the checks that build a project are skipped and
    named, the run fails (exit 1), and the write path still runs at the --teacher-shape's rows. Nothing is built."""
    path = str(Path(sys.executable).parent)  # this venv's python, zg and dvc; no git
    assert shutil.which("git", path=path) is None
    checks = "materialize,cached_online,write_path"
    r = _gpu_check(
        "--smoke", "--teacher-shape", "llama-3.1-8b", "--checks", checks, tmp_path=tmp_path, env={"PATH": path}
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "FAIL git on PATH: `zg init` and DVC need git; skipped: materialize, cached_online" in r.stdout
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["failed"] == ["git on PATH"] and "materialize_tok_s" not in res and "cached_equals_online" not in res
    assert res["hidden"] == 128 and res["boundaries"] == 2 and res["write_path_gbps"] > 0  # the smoke shape's rows
    assert res["loader_cores"] == cores() and res["loader_first_epoch_ratio"] > 0
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []  # no project, no teacher


@pytest.mark.parametrize(
    "args, error",
    [
        (["--teacher-shape", "llama-3.1-8b", "--layers", "6"], "--layers must be a multiple of 4"),
        (["--teacher-shape", "llama-3.1-8b", "--project", "x"], "--project and --teacher-shape"),
        (["--teacher-shape", "llama-3"], "invalid choice: 'llama-3'"),
        (["--checks", "write_path,materialise"], "unknown check 'materialise' in --checks; choose from materialize,"),
        (["--project", "nowhere"], "--project nowhere: no dvc.yaml there"),
    ],
)
def test_gpu_check_refuses_a_teacher_shape_it_cannot_build(args, error, tmp_path):
    r = _gpu_check("--smoke", *args, tmp_path=tmp_path)
    assert r.returncode == 2 and error in r.stderr, r.stderr
    assert not (tmp_path / "work").exists()

"""bench/gpu_check.py, the prepared GPU checks, runs on CPU as a smoke test: every check it can run without Ray
(materialize against the forward, cached == online training of b00, the write path, a MoE block's batch invariance)
passes on the tiny project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_gpu_check_smoke_run_on_cpu(tiny_built, tmp_path):
    env = {**os.environ, "ZG_DEVICE": "cpu"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--smoke", "--project", str(tiny_built)]
        + ["--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["device"] == "cpu" and res["failed"] == []
    assert res["cached_equals_online"] is True
    assert res["materialize_tok_s"] > 0 and res["write_path_gbps"] > 0 and res["write_path_blob_gbps"] > 0
    assert res["moe_batch_invariant"] is True and res["moe_zg_padded_grouped_mm_tokens_changed"] == 0.0

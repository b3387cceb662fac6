"""Data-parallel materialize (materialize.workers > 1) on a real local Ray instance.

Every sharded result is compared row by row (seq_id, split, hidden bits, checksum), with its
fingerprints and stats, against `tiny_built`'s boundaries, which `zg data materialize` wrote
in one process (workers: 1). Kills are real `kill -9`s of a Ray worker process (found through
the pid the shard task logs under ZG_TEST_SHARD_LOG) and of the `zg` driver process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from fractions import Fraction

import lance
import pytest
import torch
import yaml

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.datasets import boundary_bits
from tests.helpers.projects import edit_params, tree_sha256
from tests.helpers.runners import kill_9_when, zg
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.materialize.shard_task import VERSIONS, run_shard
from zgdata.materialize.sharded import plan
from zgdata.store.lance_io import open_dataset, schema_meta

HANG_GUARD_S = 600  # loops below wait for events, never for a duration: this only stops a hung test


def _configs(root):
    params = yaml.safe_load((root / "params.yaml").read_text())
    return section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")


def _rows(root) -> dict:
    """Per boundary: every column of every row (Arrow, exact), fingerprint, stats, rows per fragment, data files."""
    out = {}
    for path in sorted((root / "data" / "boundaries").glob("*.lance")):
        ds = open_dataset(path, kind="boundary")
        meta = schema_meta(ds.schema)
        out[path.stem] = {
            "table": ds.to_table(),
            "fingerprint": meta["fingerprint"],
            "stats": meta["stats"],
            "fragments": [f.count_rows() for f in ds.get_fragments()],
            "files": len(list((path / "data").iterdir())),
        }
    return out


def _assert_same_as_single_process(root, tiny_built) -> dict:
    got, want = _rows(root), _rows(tiny_built)
    assert sorted(got) == sorted(want) == ["h00", "h02", "h04"]
    for n in want:
        assert got[n]["fingerprint"] == want[n]["fingerprint"], n
        assert got[n]["table"].column_names == ["seq_id", "split", "hidden", "checksum"]
        for col in got[n]["table"].column_names:  # seq_id order, splits, every stored bit, every checksum
            assert got[n]["table"].column(col).equals(want[n]["table"].column(col)), (n, col)
        assert got[n]["stats"] == want[n]["stats"], n
        assert got[n]["files"] == len(got[n]["fragments"]), f"{n}: uncommitted data files were published"
    bits_got, bits_want = boundary_bits(root), boundary_bits(tiny_built)
    for n in bits_want:
        assert torch.equal(bits_got[n]["bits"], bits_want[n]["bits"]), n
        assert torch.equal(bits_got[n]["seq_id"], bits_want[n]["seq_id"]), n
    return got


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_plan_shards_are_whole_batches():
    assert plan(0, 56, batch_size=8, rows_per_file=1024, workers=2) == [(0, 32), (32, 56)]
    assert plan(0, 56, batch_size=8, rows_per_file=16, workers=2) == [(0, 16), (16, 32), (32, 48), (48, 56)]
    assert plan(0, 56, batch_size=8, rows_per_file=5, workers=2)[:2] == [(0, 8), (8, 16)]  # never below a batch
    assert plan(16, 56, batch_size=8, rows_per_file=16, workers=2) == [(16, 32), (32, 48), (48, 56)]
    assert plan(56, 56, batch_size=8, rows_per_file=16, workers=2) == []


def test_stats_are_the_exact_mean_of_token_rms(tiny_built):
    """The stats definition (zgdata/materialize/stats.py): mean of per-token float32 RMS, summed exactly, rounded once."""
    for path in sorted((tiny_built / "data" / "boundaries").glob("*.lance")):
        x = boundary_bits(tiny_built)[path.stem]["bits"].view(torch.bfloat16).float()
        rms = x.pow(2).mean(-1).sqrt().reshape(-1)
        want = float(sum(Fraction(v) for v in rms.tolist()) / rms.numel())
        stats = schema_meta(open_dataset(path, kind="boundary").schema)["stats"]
        assert stats == {"mean_rms": want, "absmax": float(x.abs().max())}, path.stem


def test_sharded_equals_single_process(tiny_built, tiny_project, ray_session):
    edit_params(tiny_project, materialize={"workers": 2})
    shutil.rmtree(tiny_project / "data" / "boundaries")
    cfg, part = _configs(tiny_project)
    r = materialize(cfg, part, layout=Layout(tiny_project))
    assert not r.skipped and r.resumed_from == 0
    got = _assert_same_as_single_process(tiny_project, tiny_built)
    # 56 rows, batch 8, 2 workers: two shards of whole batches, committed one each, compacted into one file
    assert {n: g["fragments"] for n, g in got.items()} == {n: [56] for n in got}
    assert r.stats == {n: g["stats"] for n, g in got.items()}
    assert not any((tiny_project / "data" / ".staging").iterdir())
    versions = lance.dataset(str(tiny_project / "data" / "boundaries" / "h02.lance")).versions()
    assert len(versions) == 1 and versions[0]["metadata"]["total_rows"] == "56"  # published as one version


def test_killed_worker_is_retried_and_its_files_never_published(
    tiny_built, tiny_project, ray_session, tmp_path, monkeypatch
):
    log = tmp_path / "shards.log"
    monkeypatch.setenv("ZG_TEST_SHARD_LOG", str(log))
    monkeypatch.setenv("ZG_FAILPOINT_SLEEP_IN_SHARD", str(HANG_GUARD_S))  # the first shard to finish waits here
    edit_params(tiny_project, materialize={"workers": 2, "rows_per_file": 16})
    shutil.rmtree(tiny_project / "data" / "boundaries")
    killed = {}

    sleeper = tmp_path / "shards.log.sleeper"  # the attempt that wrote it has written its fragments and sleeps

    def killer():
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            try:
                killed.update(json.loads(sleeper.read_text()))
                break
            except (OSError, ValueError):  # not there yet, or being written
                time.sleep(0.05)
        if killed:
            os.kill(killed["pid"], signal.SIGKILL)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    cfg, part = _configs(tiny_project)
    materialize(cfg, part, layout=Layout(tiny_project))
    t.join()
    assert killed, "no shard attempt was logged"
    attempts = [e for e in _log(log) if e["lo"] == killed["lo"]]
    assert len(attempts) == 2 and attempts[0]["pid"] == killed["pid"] != attempts[1]["pid"], attempts
    assert not _alive(killed["pid"])
    assert sorted({e["lo"] for e in _log(log)}) == [0, 16, 32, 48]
    got = _assert_same_as_single_process(tiny_project, tiny_built)  # incl.: the dead attempt's files are gone
    assert {n: g["fragments"] for n, g in got.items()} == {n: [56] for n in got}  # 4 shards, compacted


def _journal(root) -> dict:
    for j in (root / "data" / ".staging").glob("*/journal.json"):
        try:
            return json.loads(j.read_text())
        except (OSError, ValueError):
            pass  # being replaced right now
    return {}


def _ahead_of_journal(root) -> bool:
    j = _journal(root)
    for path in (root / "data" / ".staging").glob("*/*.lance"):
        try:
            if lance.dataset(str(path)).version > j.get("versions", {}).get(path.stem, 0):
                return True
        except Exception:  # not created yet
            continue
    return False


@pytest.mark.parametrize("failpoint", ["ZG_FAILPOINT_SLEEP_AFTER_COMMIT", "ZG_FAILPOINT_SLEEP_MID_COMMIT"])
def test_killed_driver_resumes_without_redoing_committed_shards(
    tiny_built, tiny_project, ray_session, tmp_path, monkeypatch, failpoint
):
    """kill -9 of `zg data materialize` after a journaled shard commit, or inside one (some boundaries got the
    shard, the journal not yet): the rerun rolls back what the journal lacks and runs only uncommitted shards."""
    root = tiny_project
    log = tmp_path / "shards.log"
    edit_params(root, materialize={"workers": 2, "rows_per_file": 16})
    shutil.rmtree(root / "data" / "boundaries")
    env = {**os.environ, "ZG_RAY_ADDRESS": ray_session, "ZG_TEST_SHARD_LOG": str(log)}
    mid = failpoint.endswith("MID_COMMIT")
    proc = kill_9_when(
        lambda: bool(_journal(root).get("rows_done")) and (not mid or _ahead_of_journal(root)),
        ["data", "materialize"],
        root,
        {**env, failpoint: "600"},
        tmp_path / "killed.stderr",
        "the first journaled shard commit",
    )
    assert proc.returncode == -signal.SIGKILL
    journal = _journal(root)
    done = journal["rows_done"]
    assert done == 16 and journal["shards"] == [[0, 16]]
    if failpoint.endswith("MID_COMMIT"):
        assert _ahead_of_journal(root), "the kill did not land inside a shard commit"
    deadline = time.monotonic() + HANG_GUARD_S
    # Ray stops a dead driver's tasks, but one may finish (and log) after the kill: entries carry their driver's pid
    while any(_alive(e["pid"]) for e in _log(log) if e["driver"] == proc.pid):
        assert time.monotonic() < deadline, "the killed driver's shard tasks kept running"
        time.sleep(0.05)
    assert not (root / "data" / "boundaries").exists()
    for path in (root / "data" / ".staging").glob("*/*.lance"):
        with pytest.raises(ZgError, match="half-written"):
            open_dataset(path, kind="boundary")

    # the rerun: in this process, whose Ray workers are warm (a `zg` rerun would only add their start-up)
    monkeypatch.setenv("ZG_TEST_SHARD_LOG", str(log))
    cfg, part = _configs(root)
    r = materialize(cfg, part, layout=Layout(root))
    assert r.resumed_from == done and not r.skipped
    rerun = [e for e in _log(log) if e["driver"] == os.getpid()]
    assert sorted(e["lo"] for e in rerun) == [16, 32, 48], "a committed shard ran again (or one was skipped)"
    _assert_same_as_single_process(root, tiny_built)
    assert not any((root / "data" / ".staging").iterdir())


def test_task_refuses_a_changed_teacher_or_an_unseen_staging_dir(tiny_project, tmp_path):
    """The shard task is a plain function: user-fixable failures come back as JSON, one line each."""
    layout = Layout(tiny_project)
    teacher = json.loads(layout.teacher_json.read_text())
    tokens = json.loads(layout.tokens_json.read_text())
    stage = tmp_path / "stage"
    stage.mkdir()
    spec = {
        "root": str(tiny_project),
        "stage": str(stage),
        "lo": 0,
        "hi": 8,
        "names": ["h00"],
        "layers": [0],
        "batch_size": 8,
        "seq_len": 64,
        "hidden": 64,
        "storage_dtype": "bfloat16",
        "compute_dtype": "float32",
        "threads": 1,
        "versions": VERSIONS,
        "device": "cpu",
        "hooks": {},
        "expect": {"teacher_sha256": "0" * 64, "tokens_fingerprint": tokens["fingerprint"]},
    }
    err = json.loads(run_shard(json.dumps(spec)))["error"]
    assert (
        "teacher_sha256 changed while materialize ran" in err["what"] and teacher["weights_sha256"][:12] in err["what"]
    )
    spec["expect"]["teacher_sha256"] = teacher["weights_sha256"]
    err = json.loads(run_shard(json.dumps({**spec, "stage": str(tmp_path / "elsewhere")})))["error"]
    assert "cannot see the staging dir" in err["what"] and "shared filesystem" in err["fix"]
    assert not list(stage.iterdir())


def test_more_threads_than_the_cluster_has(tiny_project, ray_session):
    root = tiny_project
    edit_params(root, materialize={"workers": 2, "worker_threads": 4})
    shutil.rmtree(root / "data" / "boundaries")
    before = tree_sha256(root / "data" / "tokens.lance")
    res = zg("data", "materialize", cwd=root, check=False, env={"ZG_RAY_ADDRESS": ray_session})
    assert_user_error_alone(res, "materialize.worker_threads", "2 CPUs", "needs 4 CPUs")
    assert not (root / "data" / "boundaries").exists()
    assert tree_sha256(root / "data" / "tokens.lance") == before

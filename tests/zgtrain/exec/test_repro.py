"""`zg repro --jobs N`: the end state of a serial `dvc repro`, with blocks trained at once on Ray.

Real `zg`, `dvc` and `git` subprocesses on the tiny profile, and the session's one Ray cluster (``ray_cluster`` /
``ray_session`` in tests/conftest.py) that `zg repro --address` joins; the remote-data-plane test adds a second
node to it for its duration. The serial arm is a snapshot of the session's ``reproduced`` project (a whole
`dvc repro`); ``base`` is that project with its blocks, student and evaluation removed, so both arms share
the same boundaries (materialize's Lance files are not byte-deterministic: UUID names).
No DVC-tracked file holds a wall-clock figure (zgdata/core/metrics_file.py puts ``tokens_per_s`` and
``seconds`` in .zg/timings/), so every dvc.lock hash is compared as is, the metrics files' too. Kill windows are widened with the trainer's test hook
ZG_FAILPOINT_SLEEP_AFTER_STEP; nothing asserts a duration.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, project_of, read_json, set_params, tree_sha256
from tests.helpers.runners import BIN, kill_9_when, run, zg
from zgdata.core.metrics_file import split_timed
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.yamlio import safe_load
from zgtrain.block.train import train_block

METRICS = ("metrics/blocks/b00.json", "metrics/blocks/b01.json", "metrics/eval.json")
LATER = ["train@b00", "train@b01", "assemble", "evaluate"]


def _lock(root) -> dict:
    return safe_load((Path(root) / "dvc.lock").read_text())["stages"]


def _recorded(root) -> set[str]:
    """Stages in dvc.lock now (for polling: DVC rewrites the file in place, so a read may catch it half-written).
    libyaml's parser (zgdata.yamlio): PyYAML's pure-Python one, polled every 20 ms, kept a core busy for the
    whole wait (30 CPU-s in one test) on a machine the other tests share."""
    try:
        return set((safe_load((Path(root) / "dvc.lock").read_text()) or {}).get("stages") or {})
    except (FileNotFoundError, yaml.YAMLError):
        return set()


def _entry(root, stage) -> dict:
    """A dvc.lock entry, every hash in it (the metrics files' included)."""
    return _lock(root)[stage]


def _untimed(root, path) -> dict:
    """A metrics file, which holds no wall-clock figure (they are in .zg/timings/)."""
    d = read_json(Path(root) / path)
    assert split_timed(d)[1] == {}, path
    return d


def _status(root) -> dict:
    return json.loads(run(["dvc", "status", "--json"], cwd=root).stdout or "{}")


def _repro(root, *args, env=None, check=True):
    return zg("repro", "--json", *args, cwd=root, env=env, check=check)


def _wait(cond, what: str, proc=None, limit: float = 300):
    deadline = time.monotonic() + limit  # a guard against hanging, not a timing assertion
    while not cond():
        assert proc is None or proc.poll() is None, f"{what}: the process ended first (rc {proc.returncode})"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)  # the failpoints sleep 0.3 s or more after each step: a kill still lands mid-run


def _meta(root, key) -> dict | None:
    p = Path(root) / "models" / "blocks" / key / "meta.json"
    return read_json(p) if p.exists() else None  # meta.json is replaced atomically


def _lock_holder(root, key) -> int | None:
    p = Path(root) / ".zg" / "locks" / f"block-{key}.lock"
    try:
        return json.loads(p.read_text()).get("pid")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _lock_free(root, key) -> bool:
    p = Path(root) / ".zg" / "locks" / f"block-{key}.lock"
    if not p.exists():
        return True
    with open(p) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


@pytest.fixture(scope="module")
def serial(reproduced, tmp_path_factory) -> Path:
    """A snapshot of the session's ``reproduced`` project: `zg init`, then a whole serial `dvc repro`."""
    return copy_project(reproduced, tmp_path_factory.mktemp("serial") / "proj")


@pytest.fixture(scope="module")
def base(serial, tmp_path_factory) -> Path:
    """``serial`` before its blocks: the same boundaries (teacher, tokens, materialize, verify recorded in
    dvc.lock), without the outputs and dvc.lock entries of train@*, assemble and evaluate; committed to git."""
    root = copy_project(serial, tmp_path_factory.mktemp("repro") / "base")
    for rel in ("models/blocks", "metrics/blocks", "plots/loss", "models/student", "metrics/eval.json", "plots/eval"):
        p = root / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    lock["stages"] = {k: v for k, v in lock["stages"].items() if k in ("teacher", "tokens", "materialize", "verify")}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    shutil.rmtree(root / ".dvc" / "cache" / "runs")  # DVC's run cache would restore assemble/evaluate, not run them
    assert set(_status(root)) == set(LATER)
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "boundaries only"], cwd=root)
    return root


@pytest.fixture(scope="module")
def parallel(base, tmp_path_factory, ray_session) -> tuple[Path, dict, int]:
    """`zg repro --jobs 2` on the session's Ray cluster, with b00's worker killed (kill -9) after its first
    checkpoint (step 4 of 12): (project, --json result, the killed worker's pid)."""
    root = copy_project(base, tmp_path_factory.mktemp("parallel") / "proj")
    out, err = open(root.parent / "out", "w+"), open(root.parent / "err", "w+")
    proc = subprocess.Popen(
        [str(BIN / "zg"), "repro", "--json", "--jobs", "2", "--address", ray_session],
        cwd=root,
        stdout=out,
        stderr=err,
        env={**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.4"},
    )
    try:
        _wait(lambda: (_meta(root, "b00") or {}).get("step", 0) > 0 and _lock_holder(root, "b00"), "checkpoint 4", proc)
        worker = _lock_holder(root, "b00")
        assert worker != proc.pid and not _meta(root, "b00")["done"]
        os.kill(worker, signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, err.seek(0) or err.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    out.seek(0)
    return root, json.loads(out.read()), worker


# --- guarantee 7: the same end state as a serial `dvc repro` ------------------------------------------------


def test_parallel_repro_ends_where_dvc_repro_does(serial, parallel):
    root, r, _ = parallel
    assert sorted(r["ran"][:2]) == ["train@b00", "train@b01"] and r["ran"][2:] == ["assemble", "evaluate"]
    assert set(_lock(root)) == set(_lock(serial))
    for stage in _lock(serial):
        assert _entry(root, stage) == _entry(serial, stage), stage
    for path in METRICS:
        assert _untimed(root, path) == _untimed(serial, path), path
    for key in ("b00", "b01"):
        assert (
            r["blocks"][key]["state_sha256"] == read_json(serial / "metrics" / "blocks" / f"{key}.json")["state_sha256"]
        )
        assert r["blocks"][key]["threads"] == 1  # train.threads, what each task asked Ray for
    assert _status(root) == {}
    again = run(["dvc", "repro"], cwd=root)
    assert "Running stage" not in again.stdout + again.stderr


def test_summary_names_where_each_block_ran(parallel):
    root, r, _ = parallel
    assert r["cluster"]["nodes"] >= 1 and not r["cluster"]["started"]
    for key in ("b00", "b01"):
        b = r["blocks"][key]
        assert b["pid"] != os.getpid() and b["node"] and b["host"]
        assert b["peak_rss_mb"] > 0


def test_up_to_date_project_runs_nothing_and_starts_no_ray(parallel, tmp_path):
    root = copy_project(parallel[0], tmp_path / "proj")
    r = json.loads(_repro(root, "--jobs", "2").stdout)  # no --address: it would start a local Ray if it needed one
    assert r["ran"] == r["restored"] == [] and r["blocks"] == {} and r["cluster"] is None


def test_jobs_1_runs_in_process_without_ray(serial, base, tmp_path):
    root = copy_project(base, tmp_path / "proj")
    shadow = tmp_path / "no-ray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('zg repro --jobs 1 must not import ray')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    r = json.loads(_repro(root, "train@b00", "--jobs", "1", env=env).stdout)
    assert r["ran"] == ["train@b00"] and r["cluster"] is None
    assert r["blocks"]["b00"]["pid"] != os.getpid() and r["blocks"]["b00"]["threads"] == 1
    assert _entry(root, "train@b00") == _entry(serial, "train@b00")
    assert _status(root).keys() == {"train@b01", "assemble", "evaluate"}


# --- faults --------------------------------------------------------------------------------------------------


def test_worker_killed_mid_block_is_retried_and_resumes_bitwise(serial, parallel):
    root, r, killed = parallel
    b = r["blocks"]["b00"]
    assert b["status"] == "done" and b["pid"] != killed  # Ray retried it in another worker process
    assert b["state_sha256"] == read_json(serial / "metrics" / "blocks" / "b00.json")["state_sha256"]
    assert _entry(root, "train@b00") == _entry(serial, "train@b00")  # the block directory too: nothing left over
    curve = (root / "plots" / "loss" / "b00.csv").read_text()
    assert curve == (serial / "plots" / "loss" / "b00.csv").read_text()


def test_driver_killed_then_rerun_finishes_and_retrains_nothing_recorded(base, tmp_path, ray_session):
    root = copy_project(base, tmp_path / "proj")
    set_params(root, {"blocks.b01.steps": 40})  # b01 still runs when b00 has been recorded
    run(["git", "commit", "-qam", "longer b01"], cwd=root)
    err = open(tmp_path / "err", "w+")
    proc = subprocess.Popen(
        [str(BIN / "zg"), "repro", "train@b00", "train@b01", "assemble", "--jobs", "2", "--address", ray_session],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=err,
        env={**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.3"},
    )
    try:
        _wait(lambda: "train@b00" in _recorded(root), "train@b00 recorded", proc)
        _wait(lambda: (_meta(root, "b01") or {}).get("step", 0) > 0, "b01 past a checkpoint", proc)
        assert not _meta(root, "b01")["done"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Ray ends the dead driver's tasks; the block lock goes with the worker's process
    _wait(lambda: _lock_free(root, "b01"), "the killed driver's worker to end")
    b00 = {
        p: tree_sha256(root / p) if (root / p).is_dir() else (root / p).read_bytes()
        for p in ("models/blocks/b00", "metrics/blocks/b00.json", "plots/loss/b00.csv")
    }
    recorded = _lock(root)["train@b00"]
    init = (root / "models/blocks/b01/init.safetensors").stat()

    r = json.loads(_repro(root, "train@b00", "train@b01", "assemble", "--jobs", "2", "--address", ray_session).stdout)
    assert r["ran"] == ["train@b01", "assemble"] and list(r["blocks"]) == ["b01"]
    assert b00 == {p: tree_sha256(root / p) if (root / p).is_dir() else (root / p).read_bytes() for p in b00}
    assert _lock(root)["train@b00"] == recorded
    st = (root / "models/blocks/b01/init.safetensors").stat()
    assert (st.st_ino, st.st_mtime_ns) == (init.st_ino, init.st_mtime_ns)  # b01 resumed, not restarted
    assert set(_status(root)) <= {"verify", "evaluate"}  # not among the targets


def test_a_killed_retrain_beside_the_old_block_resumes_there(serial, tmp_path):
    """After a params edit, `zg repro` trains b01 beside its recorded folder (now another run's), which stays until
    the new run publishes. Killed after a checkpoint there, the rerun resumes from it (it used to remove it and
    start over, on every retry too) and ends with a straight run's bits."""
    root, straight = (copy_project(serial, tmp_path / n) for n in ("proj", "straight"))
    for r in (root, straight):
        set_params(r, {"blocks.b01.lr": 7e-4})
    run(["git", "commit", "-qam", "b01 lr"], cwd=root)
    beside = root / "models/blocks/.b01.staging"
    proc = kill_9_when(
        lambda: (read_json(beside / "meta.json") if (beside / "meta.json").exists() else {}).get("step", 0) > 0,
        ["repro", "train@b01", "--jobs", "1"],
        root,
        {**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.5"},
        tmp_path / "killed.stderr",
        "b01's first checkpoint beside its old folder",
    )
    assert proc.returncode == -signal.SIGKILL and not read_json(beside / "meta.json")["done"]
    assert _meta(root, "b01")["done"]  # the recorded run is still there
    init = (beside / "init.safetensors").stat()

    r = json.loads(_repro(root, "train@b01", "--jobs", "1").stdout)
    assert r["blocks"]["b01"]["status"] == "done" and not beside.exists()
    st = (root / "models/blocks/b01/init.safetensors").stat()
    assert (st.st_ino, st.st_mtime_ns) == (init.st_ino, init.st_mtime_ns)  # resumed, not restarted
    want = train_block(project_of(straight), "b01", restart=True, layout=Layout(straight))
    assert r["blocks"]["b01"]["state_sha256"] == want.state_sha256


def test_block_failing_for_good_leaves_the_others_recorded(serial, base, tmp_path, ray_session):
    root = copy_project(base, tmp_path / "proj")
    set_params(root, {"blocks.b01.lr": 1.0e38})  # AdamW's step size overflows: b01 alone diverges
    before = tree_sha256(root / "data")
    res = _repro(root, "--jobs", "2", "--address", ray_session, check=False)
    assert_user_error(
        res,
        "[blocks.b01.lr] train@b01 failed: block b01",
        "recorded in dvc.lock: train@b00",
        "not run: assemble, evaluate",
    )
    assert res.returncode != 0 and res.stdout == ""
    assert _entry(root, "train@b00") == _entry(serial, "train@b00")
    assert "train@b01" not in _lock(root) and not (root / "models" / "student").exists()
    assert set(_status(root)) == {"train@b01", "assemble", "evaluate"}
    assert tree_sha256(root / "data") == before


def test_invalid_per_block_value_fails_before_anything_runs(base, tmp_path):
    root = copy_project(base, tmp_path / "proj")
    before = tree_sha256(root)
    # the driver checks ZG_DEVICE without loading torch on the CPU (zgdata/core/runtime.py device_type), but it checks
    res = _repro(root, "--jobs", "2", env={"ZG_DEVICE": "nonsense"}, check=False)
    assert_user_error(res, "ZG_DEVICE='nonsense' is not a torch device", alone=True)
    assert tree_sha256(root) == before
    set_params(root, {"blocks.b01.threads": 0})
    before = tree_sha256(root)
    res = _repro(root, "--jobs", "2", check=False)
    assert_user_error(res, "blocks.b01.threads", alone=True)
    assert tree_sha256(root) == before


# --- mixed precision (train.precision) ------------------------------------------------------------------------


def test_bf16_run_and_its_resume_are_bitwise_equal(serial, base, tmp_path):
    straight, resumed = (copy_project(base, tmp_path / n) for n in ("straight", "resumed"))
    for root in (straight, resumed):
        set_params(root, {"train.precision": "bf16"})
    ref = train_block(project_of(straight), "b00", layout=Layout(straight))  # in this process ...
    stopped = train_block(project_of(resumed), "b00", stop_after=5, layout=Layout(resumed))
    assert stopped.status == "stopped" and stopped.step == 5  # ... and the resume in a `zg` process
    done = json.loads(zg("train", "block", "b00", "--json", cwd=resumed).stdout)
    assert done["status"] == "done" and done["state_sha256"] == ref.state_sha256
    fp32 = read_json(serial / "metrics" / "blocks" / "b00.json")
    assert ref.state_sha256 != fp32["state_sha256"]  # autocast really ran in bf16
    assert _meta(straight, "b00")["config"]["precision"] == "bf16"


# --- nodes without a shared file system: the DVC remote is the data plane ------------------------------------


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # add_node forks this process to start a raylet
def test_remote_data_plane_workers_clone_pull_train_and_push(serial, base, tmp_path, ray_cluster):
    root = copy_project(base, tmp_path / "proj")
    run(["dvc", "remote", "add", "-d", "shared", str(tmp_path / "dvc-remote")], cwd=root)
    run(["git", "commit", "-qam", "remote"], cwd=root)
    run(["git", "clone", "-q", "--bare", str(root), str(tmp_path / "origin.git")], cwd=tmp_path)
    run(["git", "remote", "add", "origin", str(tmp_path / "origin.git")], cwd=root)
    scratch = tmp_path / "scratch"
    node = ray_cluster.add_node(num_cpus=1, object_store_memory=100 << 20)  # a second node, for this test
    try:
        r = json.loads(
            _repro(
                root,
                "train@b00",
                "train@b01",
                "--jobs",
                "2",
                "--data",
                "remote",
                "--address",
                ray_cluster.address,
                env={"ZG_SCRATCH": str(scratch)},
            ).stdout
        )
    finally:
        ray_cluster.remove_node(node)
    assert r["ran"] == ["train@b00", "train@b01"] or r["ran"] == ["train@b01", "train@b00"]
    assert len({r["blocks"][k]["node"] for k in ("b00", "b01")}) == 2  # one block on each node
    for key in ("b00", "b01"):
        b = r["blocks"][key]
        assert Path(b["scratch"]).parent == scratch  # trained in a clone, not in the project
        assert b["state_sha256"] == read_json(serial / "metrics" / "blocks" / f"{key}.json")["state_sha256"]
        assert _entry(root, f"train@{key}") == _entry(serial, f"train@{key}")
        assert _untimed(root, f"metrics/blocks/{key}.json") == _untimed(serial, f"metrics/blocks/{key}.json")
    assert not list(scratch.iterdir())  # each clone is removed once its block is pushed
    assert not set(_status(root)) & {"train@b00", "train@b01"}
    pushed = run(["dvc", "status", "--cloud", "--json", "train@b00", "train@b01"], cwd=root).stdout
    assert json.loads(pushed or "{}") == {}  # the remote holds both blocks


def _driver_state(root: Path) -> tuple:
    """What a receive of b01 may change in the driver's project: dvc.lock, b01's uncached outputs, its folder."""
    files = ("dvc.lock", "metrics/blocks/b01.json", "plots/loss/b01.csv")
    return tuple((root / f).read_bytes() for f in files) + (tree_sha256(root / "models" / "blocks" / "b01"),)


def test_a_received_block_is_checked_and_a_failed_receive_leaves_the_project_as_it_was(serial, tmp_path):
    """The driver's side of `--data remote` (scratch.receive), given what a worker returns for b01 (its dvc.lock
    entry, uncached outputs and state) with a driver that has nothing cached: the remote serving b00's file list
    under b01's md5, a block trained with other params and a failed pull are refused, each leaving dvc.lock, the
    uncached outputs and the recorded block as they were (before, the lock entry and metrics were written and the
    block folder deleted; the planted list was recorded), as are a block trained under another seed, one whose
    state is not the one the worker reported and an output outside the project; the real one is received. Once the remote serves the real
    objects, a retry in the same project receives the block: what the refused pull left in the DVC cache, and the
    listing DVC remembered, are forgotten (before, the retry failed with DVC's "Is your cache up to date?")."""
    from zgtrain.exec import scratch
    from zgtrain.project.config import ProjectConfig

    remote = tmp_path / "dvc-remote"

    def driver(name: str) -> Path:
        """A copy of ``serial`` whose DVC cache is empty: it has only what the remote serves (each its own copy:
        DVC also keeps what it fetched in an index outside the project, keyed by the project's path)."""
        root = copy_project(serial, tmp_path / name)
        run(["dvc", "remote", "add", "-d", "shared", str(remote)], cwd=root)
        if not remote.exists():
            run(["dvc", "push", "-q", "train@b00", "train@b01"], cwd=root)
        shutil.rmtree(root / ".dvc" / "cache")
        return root

    root = driver("planted")
    lock = _lock(root)
    r = {
        "key": "b01",
        "lock_entry": lock["train@b01"],
        "uncached": {p: (root / p).read_text() for p in ("metrics/blocks/b01.json", "plots/loss/b01.csv")},
        "state_sha256": read_json(root / "metrics" / "blocks" / "b01.json")["state_sha256"],
    }
    r["uncached"]["metrics/blocks/b01.json"] += " "  # the worker's copy differs: a failed receive must not keep it
    project = ProjectConfig.load(root / "params.yaml")
    before = _driver_state(root)

    def obj(stage: str) -> Path:
        h = next(o["md5"] for o in lock[stage]["outs"] if o["path"].startswith("models/blocks/"))
        return remote / "files" / "md5" / h[:2] / h[2:]

    real = obj("train@b01").read_bytes()
    obj("train@b01").write_bytes(obj("train@b00").read_bytes())
    with pytest.raises(ZgError, match="b01 pulled from the DVC remote is not the one the worker pushed"):
        scratch.receive(root, r, project)
    assert _driver_state(root) == before
    obj("train@b01").write_bytes(real)
    scratch.receive(root, r, project)  # a retry in the same project, once the remote serves the real objects
    assert tree_sha256(root / "models" / "blocks" / "b01") == before[-1]

    root = driver("planted-file")  # the real file list, one of its files served with other bytes
    weights = next(e["md5"] for e in json.loads(real) if e["relpath"] == "model.safetensors")
    weights = remote / "files" / "md5" / weights[:2] / weights[2:]
    good = weights.read_bytes()
    weights.write_bytes(good[::-1])
    with pytest.raises(ZgError, match="b01 pulled from the DVC remote is not the one the worker pushed"):
        scratch.receive(root, r, project)
    assert _driver_state(root) == before
    weights.write_bytes(good)
    scratch.receive(root, r, project)
    assert tree_sha256(root / "models" / "blocks" / "b01") == before[-1]

    root = driver("other-params")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["blocks"]["b01"]["lr"] = 0.5
    with pytest.raises(ZgError, match="b01 came back trained with other params"):
        scratch.receive(root, r, ProjectConfig.from_params(params))
    assert _driver_state(root) == before
    params = {**yaml.safe_load((root / "params.yaml").read_text()), "seed": 1}  # the same config, another seed
    with pytest.raises(ZgError, match="b01 came back trained with other params"):
        scratch.receive(root, r, ProjectConfig.from_params(params))
    assert _driver_state(root) == before
    with pytest.raises(ZgError, match="b01 pulled from the DVC remote holds another state than the worker reported"):
        scratch.receive(root, {**r, "state_sha256": "0" * 64}, project)
    assert _driver_state(root) == before
    outside = {**r, "uncached": {**r["uncached"], "../outside.json": "{}"}}
    with pytest.raises(ZgError, match="b01 came back with an output outside the project: ../outside.json"):
        scratch.receive(root, outside, project)
    assert _driver_state(root) == before and not (root.parent / "outside.json").exists()

    root = driver("no-remote")
    shutil.move(remote, tmp_path / "away")
    with pytest.raises(ZgError, match="dvc pull train@b01"):
        scratch.receive(root, r, project)
    assert _driver_state(root) == before
    shutil.move(tmp_path / "away", remote)

    root = driver("received")
    block = tree_sha256(root / "models" / "blocks" / "b01")
    shutil.rmtree(root / "models" / "blocks" / "b01")
    scratch.receive(root, r, project)
    assert tree_sha256(root / "models" / "blocks" / "b01") == block
    assert (root / "metrics" / "blocks" / "b01.json").read_text() == r["uncached"]["metrics/blocks/b01.json"]


def test_two_drivers_at_one_commit_with_other_params_train_in_other_scratch_folders():
    """The scratch folder is keyed by the pipeline files laid over the clone too: two drivers at one commit with
    other uncommitted params never share one (one block then trained on the other's params); the same source on
    a retry gets the same folder (it resumes from the block's checkpoint)."""
    from zgtrain.exec.scratch import _scratch

    source = {"url": "/srv/origin.git", "rev": "a" * 40, "files": {"params.yaml": "seed: 0\n", "dvc.lock": "x\n"}}
    other = {**source, "files": {**source["files"], "params.yaml": "seed: 1\n"}}
    assert _scratch(source, "b01") == _scratch(dict(source), "b01") != _scratch(other, "b01")
    assert _scratch(source, "b01") != _scratch(source, "b00")

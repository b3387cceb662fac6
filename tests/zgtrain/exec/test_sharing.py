"""Sharing boundary datasets through DVC remotes: team B trains one block without the teacher.

Real git and dvc in temporary directories, tiny profile. Team A's repository is the session's reproduced
tiny project (conftest.py: `zg init` and a whole `dvc repro`, committed) and each test
publishes its own copy to a remote (a local directory, or S3 on a moto server on 127.0.0.1),
then clones it the way another team would. docs/SHARING.md documents these commands.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.assertions import assert_user_error
from tests.helpers.runners import BIN, run, zg_main
from zgtrain.project.config import TrainConfig

# What team B needs for block b01 of the tiny profile (boundaries [0, 2, 4]: b01 maps h02 -> h04).
B01_INPUTS = ["data/boundaries/h02.lance", "data/boundaries/h04.lance", "models/teacher/blocks/b01.safetensors"]
# What it must not need: the whole teacher, the token set, other boundaries and slices.
NOT_NEEDED = [
    "models/teacher/hf",
    "models/teacher/teacher.json",
    "models/teacher/blocks/head.safetensors",
    "models/teacher/blocks/b00.safetensors",
    "data/tokens.lance",
    "data/tokens.json",
    "data/boundaries/h00.lance",
]
S3_ENV = {"AWS_ACCESS_KEY_ID": "zg-test", "AWS_SECRET_ACCESS_KEY": "zg-test", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "zg-boundaries"


def git_commit(root: Path, msg: str) -> None:
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-q", "-m", msg], cwd=root)


def dvc(*args, cwd, check=True, env=None, timeout=300) -> subprocess.CompletedProcess:
    return run([str(BIN / "dvc"), *map(str, args)], cwd=cwd, check=check, env=env, timeout=timeout)


def state_of(root: Path, key: str = "b01") -> str:
    return json.loads((root / "metrics" / "blocks" / f"{key}.json").read_text())["state_sha256"]


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file in a workspace, git and DVC internals excluded."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith((".git/", ".dvc/")):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_only_block_inputs(root: Path) -> None:
    for rel in B01_INPUTS:
        assert (root / rel).exists(), f"{rel} was not pulled"
    for rel in NOT_NEEDED:
        assert not (root / rel).exists(), f"{rel} was pulled but block b01 does not need it"


@contextlib.contextmanager
def closed_port():
    """A port of 127.0.0.1 that refuses connections while the block runs: bound by this process, never listening,
    so no other process (a Ray worker's gRPC server) can start listening on it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def team_a(reproduced_base, tmp_path_factory) -> dict:
    """Team A's repository: the session's reproduced tiny project (`zg init`, then `dvc repro` of every stage,
    dvc.lock and metrics committed; no remote yet)."""
    root = tmp_path_factory.mktemp("team_a") / "A"
    shutil.copytree(reproduced_base / "proj", root, symlinks=True)
    assert run(["git", "status", "--porcelain"], cwd=root).stdout == ""
    return {"root": root, "b01_state": state_of(root)}


def publish(team_a: dict, dst: Path, name: str, url: str, *, env=None, **options) -> Path:
    """A copy of team A's repo that adds a default remote, commits .dvc/config and pushes."""
    root = dst / "A"
    shutil.copytree(team_a["root"], root, symlinks=True)
    dvc("remote", "add", "-d", name, url, cwd=root)
    for k, v in options.items():
        dvc("remote", "modify", name, k, v, cwd=root)
    git_commit(root, f"remote {name}")
    out = dvc("push", "-j", "4", cwd=root, env=env).stdout
    assert "pushed" in out, out
    return root


def clone(src: Path, dst: Path) -> Path:
    run(["git", "clone", "-q", str(src), str(dst)], cwd=src.parent)
    return dst


@pytest.fixture
def local_remote(team_a, tmp_path) -> Path:
    """Team A's repo with a local-directory remote (committed in .dvc/config), pushed."""
    return publish(team_a, tmp_path, "shared", str(tmp_path / "remote"))


@pytest.fixture
def team_b(local_remote, tmp_path) -> Path:
    """Team B: a fresh clone that pulled only block b01's inputs."""
    b = clone(local_remote, tmp_path / "B")
    dvc("pull", "-j", "4", *B01_INPUTS, cwd=b)
    assert_only_block_inputs(b)
    return b


# moto's server in a process of its own, on a port it binds itself (0: the kernel picks) and prints: a port picked
# free beforehand can be taken by another process (a Ray worker's gRPC server) before moto binds it. It serves until
# its stdin closes.
MOTO_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@pytest.fixture
def moto_s3():
    """A moto S3 server on 127.0.0.1 with one bucket; stopped afterwards."""
    import boto3

    proc = subprocess.Popen(
        [str(BIN / "python"), "-c", MOTO_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the port once the server listens; "" if it died first
        if not line.strip().isdigit():
            raise RuntimeError(f"the moto server did not start (exit code {proc.poll()})")
        endpoint = f"http://127.0.0.1:{int(line)}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=S3_ENV["AWS_DEFAULT_REGION"],
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- sharing works ------------------------------------------------------------------------------------


def test_local_remote_clone_pulls_one_block_and_trains_it_without_teacher(team_a, team_b):
    """`dvc pull <b01 inputs>` + `zg train block b01` in a fresh clone: same bits as team A, no teacher."""
    verify = json.loads(zg_main("data", "verify", "--lineage-only", "--json", cwd=team_b).stdout)
    assert verify["status"] == "ok" and sorted(verify["boundaries"]) == ["h02", "h04"]
    src = json.loads(zg_main("data", "inspect", "data/boundaries/h02.lance", "--json", cwd=team_b).stdout)[0]["source"]
    assert src == {"tracked_by": "dvc.lock", "stage": "materialize", "path": "data/boundaries/h02.lance"}

    (team_b / "metrics" / "blocks" / "b01.json").unlink()  # team A's committed copy: prove B writes its own
    zg_main("train", "block", "b01", cwd=team_b)
    assert state_of(team_b) == team_a["b01_state"]
    assert_only_block_inputs(team_b)  # training fetched nothing else (it cannot: no teacher, no materialize)
    assert not (team_b / "models" / "blocks" / "b00").exists()


def test_s3_remote_repro_pull_allow_missing_trains_one_block(team_a, moto_s3, tmp_path):
    """S3 (moto): `dvc repro --pull --allow-missing train@b01` pulls only b01's deps and trains it."""
    a = publish(team_a, tmp_path, "s3", f"s3://{BUCKET}/zg", env=S3_ENV, endpointurl=moto_s3)
    b = clone(a, tmp_path / "B")
    assert "endpointurl" in (b / ".dvc" / "config").read_text()  # the clone sees the remote; keys come from env

    # Unchanged stage: dvc.lock already records team A's result, so --allow-missing skips it and pulls nothing.
    out = dvc("repro", "--pull", "--allow-missing", "--no-run-cache", "train@b01", cwd=b, env=S3_ENV)
    assert "Running stage" not in out.stdout, out.stdout
    assert (
        not list(b.glob("data/boundaries/*.lance"))
        and not (b / "models" / "teacher" / "blocks" / "b01.safetensors").exists()
    )

    # Team B's own change to its block (checkpoint_every does not change the trained bits, so the
    # result must still equal team A's): the stage reruns, and DVC pulls exactly its missing deps.
    params = yaml.safe_load((b / "params.yaml").read_text())
    params["blocks"]["b01"]["checkpoint_every"] = 6
    (b / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (b / "metrics" / "blocks" / "b01.json").unlink()
    out = dvc("repro", "--pull", "--allow-missing", "--no-run-cache", "train@b01", cwd=b, env=S3_ENV, timeout=600)
    assert "Running stage 'train@b01'" in out.stdout, out.stdout
    for upstream in ("teacher", "tokens", "materialize"):
        assert f"Running stage '{upstream}'" not in out.stdout
    assert_only_block_inputs(b)
    assert state_of(b) == team_a["b01_state"]
    lock = yaml.safe_load((b / "dvc.lock").read_text())["stages"]["train@b01"]
    assert sorted(d["path"] for d in lock["deps"]) == sorted(B01_INPUTS)  # its pair and its slice, nothing else
    # and its own params: train's keys one by one, but the one that changes none of its outputs
    assert sorted(lock["params"]["params.yaml"]) == sorted(["blocks.b01", "seed", *TrainConfig.stage_keys()])


def test_dvc_import_into_another_project_trains_block(team_a, tmp_path):
    """A separate project `dvc import`s b01's inputs from team A's repo and trains from them."""
    a = team_a["root"]
    c = tmp_path / "C"
    c.mkdir()
    run(["git", "init", "-q"], cwd=c)
    dvc("init", "-q", cwd=c)
    dvc("config", "cache.type", "reflink,hardlink,copy", cwd=c)
    for rel in B01_INPUTS:
        (c / rel).parent.mkdir(parents=True, exist_ok=True)  # dvc import needs the output's folder
        dvc("import", a, rel, "-o", rel, cwd=c)
    shutil.copy(a / "params.yaml", c / "params.yaml")
    git_commit(c, "import b01 inputs from team A")

    assert json.loads(zg_main("data", "verify", "--lineage-only", "--json", cwd=c).stdout)["status"] == "ok"
    info = json.loads(zg_main("data", "inspect", "data/boundaries/h02.lance", "--json", cwd=c).stdout)[0]
    rev = run(["git", "rev-parse", "HEAD"], cwd=a).stdout.strip()
    assert info["source"]["tracked_by"] == "data/boundaries/h02.lance.dvc"
    assert info["source"]["import"] == {
        "url": str(a),
        "path": "data/boundaries/h02.lance",
        "rev": None,
        "rev_lock": rev,
    }

    zg_main("train", "block", "b01", cwd=c)
    assert state_of(c) == team_a["b01_state"]
    assert_only_block_inputs(c)

    # C has no dvc.yaml: its imports' .dvc files, as git's HEAD has them, are its record, and every read checks
    # them. A data file of h02 replaced with other bytes is refused, and the fix never says `dvc add` (that would
    # record these bytes as team A's at rev_lock)
    data = max((c / "data" / "boundaries" / "h02.lance" / "data").glob("*.lance"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.with_name("flipped").write_bytes(raw)
    os.replace(data.with_name("flipped"), data)  # a new file: the cache's copy stays intact
    for args in (("data", "verify", "--lineage-only"), ("train", "block", "b01", "--restart")):
        line = assert_user_error(
            zg_main(*args, cwd=c, check=False),
            "does not match data/boundaries/h02.lance.dvc (git HEAD)",
            "dvc checkout --force data/boundaries/h02.lance",
        )
        assert "never `dvc add`" in line and "dvc add data" not in line
    assert state_of(c) == team_a["b01_state"]  # the refused run changed nothing


# -- bad input ---------------------------------------------------------------------------------------


def _relineage(src: Path, dst: Path, **changes) -> None:
    """A copy of boundary dataset ``src`` whose lineage (and so fingerprint) says it came from elsewhere."""
    import lance

    from zgdata.lineage import boundary_fingerprint
    from zgdata.store.lance_io import encode_meta, schema_meta

    shutil.copytree(src, dst, copy_function=shutil.copyfile)  # plain, writable copies (the pull hardlinks)
    ds = lance.dataset(str(dst))
    lin = {**schema_meta(ds.schema)["lineage"], **changes}
    ds.update_schema_metadata(encode_meta({"lineage": lin, "fingerprint": boundary_fingerprint(lin)}))


def test_pulled_boundary_with_other_lineage_is_refused(team_b, tmp_path):
    h02, h04 = team_b / B01_INPUTS[0], team_b / B01_INPUTS[1]
    from zgdata.store.lance_io import open_dataset, schema_meta

    ours = schema_meta(open_dataset(h02).schema)["lineage"]["tokens_fingerprint"]
    theirs = "f00d" * 16  # e.g. h04 pulled from a commit that materialized another token set
    _relineage(h04, tmp_path / "other_h04.lance", tokens_fingerprint=theirs)
    shutil.rmtree(h04)
    shutil.move(tmp_path / "other_h04.lance", h04)

    # dvc.lock (git) records other bytes for h04: refused before anything reads them (zgdata/trust/dvc_lock.py)
    res = zg_main("train", "block", "b01", cwd=team_b, check=False)
    assert res.returncode != 0, res.stderr
    assert "error: data/boundaries/h04.lance" in res.stderr and "does not match dvc.lock" in res.stderr, res.stderr
    # with no dvc.lock to check against (boundaries copied in by hand), the lineage check refuses them
    (team_b / "dvc.lock").unlink()
    res = zg_main("train", "block", "b01", cwd=team_b, check=False)
    assert res.returncode != 0
    msg = res.stderr + res.stdout
    assert "lineage mismatch on tokens_fingerprint" in msg, msg
    assert ours[:16] in msg and theirs[:16] in msg, msg
    assert "Traceback" not in msg
    assert not (team_b / "models" / "blocks" / "b01").exists()

    res = zg_main("data", "verify", "--lineage-only", cwd=team_b, check=False)
    assert res.returncode == 1
    assert "tokens_fingerprint" in res.stderr and ours[:16] in res.stderr and theirs[:16] in res.stderr


def test_partially_pulled_dataset_says_rerun_dvc_pull_or_checkout(team_b):
    h04 = team_b / B01_INPUTS[1]
    rel = B01_INPUTS[1]

    # 1. A data file of the pulled dataset is missing (the cache still has it): `dvc checkout` repairs it.
    victim = sorted((h04 / "data").iterdir())[0]
    victim.unlink()
    res = zg_main("train", "block", "b01", cwd=team_b, check=False)
    assert res.returncode != 0
    assert f"dvc checkout --force {rel}" in res.stderr and "dvc pull" in res.stderr, res.stderr
    assert "missing" in res.stderr and "Traceback" not in res.stderr
    dvc("checkout", rel, cwd=team_b)
    assert victim.exists()

    # 2. An interrupted pull: no version manifests, and the local cache is gone too. `dvc pull` repairs it.
    shutil.rmtree(h04 / "_versions")
    shutil.rmtree(team_b / ".dvc" / "cache")
    res = zg_main("data", "verify", "--lineage-only", cwd=team_b, check=False)
    assert res.returncode != 0
    assert f"dvc checkout --force {rel}" in res.stderr and "dvc pull" in res.stderr, res.stderr
    dvc("pull", rel, cwd=team_b)
    assert json.loads(zg_main("data", "verify", "--lineage-only", "--json", cwd=team_b).stdout)["status"] == "ok"


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_unreachable_remote_fails_clearly_and_leaves_workspace_intact(local_remote, tmp_path, kind):
    b = clone(local_remote, tmp_path / "B")
    dvc("pull", B01_INPUTS[0], cwd=b)  # h02 is already here; h04 and the slice are still to come
    before = tree_hashes(b)
    assert B01_INPUTS[0] + "/_versions/latest_version_hint.json" in before
    if kind == "local":
        dvc("remote", "modify", "--local", "shared", "url", tmp_path / "no-such-remote", cwd=b)
        args, env = [], None
    else:  # S3 endpoint on a closed port; one attempt, or botocore retries with backoff for minutes
        dvc("remote", "add", "--local", "broken", f"s3://{BUCKET}/zg", cwd=b)
        args, env = ["-r", "broken"], {**S3_ENV, "AWS_MAX_ATTEMPTS": "1"}
    with closed_port() as port:
        if kind == "s3":
            dvc("remote", "modify", "--local", "broken", "endpointurl", f"http://127.0.0.1:{port}", cwd=b)
        res = dvc("pull", *args, *B01_INPUTS[1:], cwd=b, check=False, env=env, timeout=120)
    msg = res.stderr + res.stdout
    assert res.returncode != 0, msg
    assert "failed to pull data from the cloud" in msg, msg
    if kind == "s3":
        assert "Could not connect to the endpoint URL" in msg, msg
    else:
        assert "do not exist neither locally nor on remote" in msg or "Checkout failed" in msg, msg
    assert tree_hashes(b) == before  # nothing there was touched, nothing half-written was added
    assert not (b / B01_INPUTS[1]).exists() and not (b / B01_INPUTS[2]).exists()
    assert run(["git", "status", "--porcelain"], cwd=b).stdout == ""

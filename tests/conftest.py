"""Shared fixtures: a tiny ZeroGraph project (random:tiny teacher, a few thousand tokens).

``tiny_built`` runs teacher -> tokens -> materialize once per session through the real
CLI; ``tiny_project`` hands each test its own copy, so tests never share state.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

os.environ.setdefault("GIT_AUTHOR_NAME", "zg-tests")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "zg-tests@example.invalid")
os.environ.setdefault("GIT_COMMITTER_NAME", "zg-tests")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "zg-tests@example.invalid")
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"  # `zg` and `dvc` of this venv
os.environ["ZG_QUIET"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"


def zg(*args, cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run the real `zg` CLI in ``cwd``."""
    res = subprocess.run([str(BIN / "zg"), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"zg {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def run(cmd: list[str], cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})},
                         timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture(scope="session")
def tiny_built(tmp_path_factory) -> Path:
    """A tiny project after teacher, tokens and materialize (built once per session)."""
    root = tmp_path_factory.mktemp("tiny") / "proj"
    zg("init", root, "--profile", "tiny", cwd=tmp_path_factory.getbasetemp())
    for cmd in (("teacher", "prepare"), ("data", "tokenize"), ("data", "materialize")):
        zg(*cmd, cwd=root)
    return root


@pytest.fixture
def tiny_project(tiny_built, tmp_path) -> Path:
    """A private copy of the tiny project (git and dvc state included)."""
    dst = tmp_path / "proj"
    shutil.copytree(tiny_built, dst, symlinks=True)
    return dst


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def tree_sha256(path: Path) -> str:
    """Hash of every file's relative name and content under ``path`` (unchanged-ness checks)."""
    h = hashlib.sha256()
    path = Path(path)
    for p in sorted(x for x in path.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def assert_user_error(res, *needles: str, alone: bool = False) -> str:
    """A failed `zg` run that printed one ``error:`` line (no traceback) containing every needle.

    ``alone``: that line is all of stderr (commands that fail before any progress output)."""
    assert res.returncode != 0, f"expected a failure:\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() if alone or line.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"expected one error line, got:\n{res.stderr}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One Ray cluster for the whole session, for `zg repro --address` and friends: two nodes on this machine
    (``ray.cluster_utils.Cluster``), 1 CPU and a 100 MB object store each, no dashboard. Yields its address.

    Its processes inherit this environment (PYTHONPATH, PATH with this venv's `zg`, `dvc`, `git`)."""
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()

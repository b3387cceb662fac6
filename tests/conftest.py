"""Shared fixtures: a tiny ZeroGraph project (random:tiny teacher, a few thousand tokens).

``tiny_built`` runs teacher -> tokens -> materialize once per session through the real
CLI's ``main`` in this process (``zg_main``, for tests of a stage; ``zg`` runs the installed script,
where the process boundary is the point; both in tests/helpers/runners.py); ``tiny_project`` hands each test
its own copy, so tests never share state.
``reproduced`` is one tiny project after `zg init`, git and a whole `dvc repro`, built once per
test run (under pytest-xdist, by the first worker that needs it, under a file lock) and copied into each
worker, so its users spread over the workers; tests that change it work on their own copy
(test_pipeline's selective-rerun tests: a module-scoped one).

Fixtures and hooks only: the helpers are modules of tests/helpers/, imported by name
(``from tests.helpers.runners import zg_main``); the schedule over pytest-xdist's workers is the plugin
tests/helpers/xdist_order.py, registered here (``pytest_plugins`` is honoured only in the top conftest, this one).
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.projects import reproduce
from tests.helpers.runners import BIN, remember_fresh_threads, zg_main
from tests.helpers.xdist_order import SHARED_FIXTURES
from zgtrain.cli import GC_FIRST_THRESHOLD

pytest_plugins = ["tests.helpers.xdist_order"]

os.environ.setdefault("GIT_AUTHOR_NAME", "zg-tests")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "zg-tests@example.invalid")
os.environ.setdefault("GIT_COMMITTER_NAME", "zg-tests")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "zg-tests@example.invalid")
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"  # `zg` and `dvc` of this venv
os.environ["ZG_QUIET"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# every dvc command otherwise starts a detached `dvc daemon analytics` process (a Python start and a DVC import
# each, competing with the tests for the CPUs, and sending nothing from a machine without internet)
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # likewise Ray's usage report at each cluster start
# One torch (OpenMP) thread per process, set before torch loads here and inherited by every `zg`, `dvc` stage and
# Ray process the tests start. The suite runs 3 xdist workers and their subprocesses on 2 cores: a process whose
# torch ops split over 2 threads waits at every op for a thread that another process has descheduled (measured on
# this 2-core machine with the suite running: one forward of the tiny teacher, 3 x 32 tokens, 2.5 ms on 1 thread,
# 288 ms on 2). Bits hold per thread count (docs/concepts/guarantees.md); every run a test compares runs with this
# count, and train.threads / materialize.worker_threads still set their own where a test's params say so.
os.environ["OMP_NUM_THREADS"] = "1"
# The collector's first threshold of a `zg` process (zgtrain.cli.run), here too: the workers run stages in process
# (``zg_main``) and import what the stage processes import (test_families.py and test_encode.py together, one
# process: 64 CPU-s at Python's default, 61 at this threshold).
gc.set_threshold(GC_FIRST_THRESHOLD, *gc.get_threshold()[1:])


def pytest_configure(config):
    remember_fresh_threads()


@pytest.fixture(scope="session")
def tiny_built(tmp_path_factory) -> Path:
    """A tiny project after teacher, tokens and materialize (built once per session, in this process)."""
    root = tmp_path_factory.mktemp("tiny") / "proj"
    zg_main("init", root, "--profile", "tiny", cwd=tmp_path_factory.getbasetemp())
    for cmd in (("teacher", "prepare"), ("data", "tokenize"), ("data", "materialize")):
        zg_main(*cmd, cwd=root)
    return root


@pytest.fixture
def tiny_project(tiny_built, tmp_path) -> Path:
    """A private copy of the tiny project (git and dvc state included)."""
    dst = tmp_path / "proj"
    shutil.copytree(tiny_built, dst, symlinks=True)
    return dst


@pytest.fixture(scope="session")
def reproduced_base(tmp_path_factory, worker_id) -> Path:
    """The run's one reproduced tiny project (``reproduce``, tests/helpers/projects.py): the folder holding
    ``proj`` and, with strace, ``trace``. Read it, never change it: tests that need the project take
    ``reproduced``, a copy.

    Under pytest-xdist the first worker that needs it builds it in the run's shared temp folder while holding
    a lock; the others wait for it."""
    if worker_id == "master":  # not distributed: this process is the only user
        base = tmp_path_factory.mktemp("pipeline-base")
        reproduce(base)
        return base
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above every worker's own
    done = shared / "reproduced.done"
    with open(shared / "reproduced.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():  # a worker that failed to build it left no mark: build it again, from scratch
            shutil.rmtree(shared / "reproduced", ignore_errors=True)
            (shared / "reproduced").mkdir()
            reproduce(shared / "reproduced")
            done.touch()
    return shared / "reproduced"


@pytest.fixture(scope="session")
def reproduced(reproduced_base, tmp_path_factory) -> Path:
    """This worker's copy of the run's one reproduced tiny project (``reproduced_base``), so each worker's dvc
    and git commands have a repo of their own."""
    return shutil.copytree(reproduced_base / "proj", tmp_path_factory.mktemp("pipeline") / "proj", symlinks=True)


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's one Ray cluster (``ray.cluster_utils.Cluster`` on this machine): a head node of 2 CPUs,
    a small object store, no dashboard; this process is connected to it. A test may add a node for a while
    (``add_node`` / ``remove_node``) to run a two-node case.

    Its processes inherit this process's environment as it is now (PYTHONPATH, PATH with this venv's `zg`,
    `dvc` and `git`); `zg` subprocesses join with ``ZG_RAY_ADDRESS`` or ``--address``.
    """
    import logging
    import warnings

    import ray
    from ray.cluster_utils import Cluster

    warnings.filterwarnings("ignore", message="lance is not fork-safe")  # Ray's node processes exec at once
    # num_workers_soft_limit: keep this process's warm workers (teacher loaded) while a `zg` subprocess's job
    # starts its own; with the default (= CPUs) Ray kills the idle ones and the next test starts cold
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={
            "num_cpus": 2,
            "object_store_memory": 100 << 20,
            "include_dashboard": False,
            "_system_config": {"num_workers_soft_limit": 8},
        },
    )
    down = []

    def shutdown():
        if not down:
            down.append(True)
            ray.shutdown()
            cluster.shutdown()

    _RAY_SHUTDOWN.append(shutdown)
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
        yield cluster
    finally:
        shutdown()


_RAY_SHUTDOWN: list = []  # the session Ray cluster's shutdown, once ``ray_cluster`` has started it


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the fixtures that end with this test
def pytest_runtest_teardown(item, nextitem):
    """After the Ray group's last test, shut the session's Ray cluster down rather than at the session's end. The
    group runs first and in one piece on its worker (tests/helpers/xdist_order.py), and nothing after it uses
    the cluster; left up, its idle processes (GCS, raylet, warm workers) take about 8% of a core (5 CPU-seconds
    a minute, measured) while this worker and the others run the rest of the suite for minutes."""
    if _RAY_SHUTDOWN and (nextitem is None or not SHARED_FIXTURES & set(getattr(nextitem, "fixturenames", ()))):
        _RAY_SHUTDOWN.pop()()


@pytest.fixture(scope="session")
def ray_session(ray_cluster) -> str:
    """The address of the session's Ray cluster (``ray_cluster``), which this process is connected to."""
    return ray_cluster.address

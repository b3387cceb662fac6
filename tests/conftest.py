"""Shared fixtures: a tiny ZeroGraph project (random:tiny teacher, a few thousand tokens).

``tiny_built`` runs teacher -> tokens -> materialize once per session through the real
CLI's ``main`` in this process (``zg_main``, for tests of a stage; ``zg`` runs the installed script,
where the process boundary is the point); ``tiny_project`` hands each test its own copy, so tests
never share state.
``reproduced`` is one tiny project after `zg init`, git and a whole `dvc repro`, built once per
test run (under pytest-xdist, by the first worker that needs it, under a file lock) and copied into each
worker, so its users spread over the workers; tests that change it work on their own copy
(test_pipeline's selective-rerun tests: a module-scoped one).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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


def zg(*args, cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run the real `zg` CLI in ``cwd``."""
    res = subprocess.run(
        [str(BIN / "zg"), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"zg {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


_FRESH_THREADS = None  # torch's CPU thread count in a fresh process of this machine (read before any test changes it)


def zg_main(*args, cwd, check=True, env=None) -> subprocess.CompletedProcess:
    """Run the `zg` CLI in this process, through ``zgtrain.cli.main`` (what the `zg` script, ``zgtrain.cli.run``,
    calls): the same result as ``zg`` (exit code, stdout, stderr; a bug's traceback in stderr with code 1) without
    starting an interpreter and importing torch again.

    For tests of a stage, not of the process boundary: kills, locks held by another process, DVC, Ray and
    environment-variable failpoints read at import keep ``zg``. What a run changes in this process is put
    back afterwards: the cwd, os.environ (cli.main sets HF_* variables, --debug sets ZG_DEBUG), torch's
    thread count (trainers set train.threads; each run starts from a fresh process's count, so its bits
    are a subprocess's) and the global random states of torch, numpy and random.
    """
    import contextlib
    import io
    import random
    import traceback

    import numpy as np
    import torch

    from zgtrain.cli import main

    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        os.chdir(cwd)
        torch.set_num_threads(_FRESH_THREADS)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    res = subprocess.CompletedProcess(["zg", *map(str, args)], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"zg {' '.join(map(str, args))} failed ({code}):\n{res.stdout}\n{res.stderr}")
    return res


def pytest_configure(config):
    global _FRESH_THREADS
    import torch

    _FRESH_THREADS = torch.get_num_threads()


def run(cmd: list[str], cwd, check=True, env=None, timeout=600) -> subprocess.CompletedProcess:
    res = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


# The Ray cluster is a session fixture of one pytest process. Under pytest-xdist (`make test` runs
# `-n auto --dist loadgroup`) every test that uses it goes to the same worker, so the run still starts one
# Ray cluster; the other tests spread over the workers (``reproduced`` is built once per run and copied).
SHARED_FIXTURES = {"ray_cluster", "ray_session"}


def _module_fixture_group(item) -> str | None:
    """The test module whose own module- or session-scoped fixture ``item`` uses (a prepared SmolLM2, a
    searched or reproduced project...), so that all of that module's users run on one worker and the
    fixture is built once, not once per worker. ``tiny_built`` (conftest) is used everywhere: not grouped."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if defs and defs[-1].scope in ("module", "session") and defs[-1].baseid.endswith(".py"):
            return defs[-1].baseid
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the "@group" node-id suffix
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SHARED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif group := _module_fixture_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    # Critical path first. The Ray group runs serially on one worker and is the run's longest unit of work (its
    # tests start real `zg` drivers, Ray workers and kills): it goes first, so that worker starts it at once, and
    # its tests that use ``reproduced`` go first within it, so that worker builds it. Then the other groups (a
    # module's tests around its expensive fixture): first those that do not wait for ``reproduced`` (its build, a
    # traced one-stage-at-a-time `dvc repro`, keeps one core busy for about two minutes; a worker that took a
    # group needing it would sleep on its lock meanwhile), then those that do. Then single tests, which fill the
    # gaps at the end. `make test` keeps this order (--no-loadscope-reorder: xdist would otherwise sort groups by
    # their number of tests, and start the Ray group after groups of more, but shorter, tests).
    waits = {g for i in items if (g := _group(i)) and _REPRODUCED & set(getattr(i, "fixturenames", ()))}
    items.sort(key=lambda item: _schedule_rank(item, waits))


_REPRODUCED = {"reproduced", "reproduced_base"}


def _group(item) -> str | None:
    groups = [m.args[0] for m in item.iter_markers("xdist_group")]
    return groups[0] if groups else None


def _schedule_rank(item, waits=frozenset()) -> int:
    """0: the Ray group's tests that build ``reproduced``; 1: the rest of the Ray group; 2: groups that never
    wait for ``reproduced``; 3: groups that do; 4: single tests."""
    group = _group(item)
    if group == "ray":
        return 0 if _REPRODUCED & set(getattr(item, "fixturenames", ())) else 1
    if group:
        return 3 if group in waits else 2
    return 4


_LOW_PRIORITY = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under pytest-xdist, a worker lowers its CPU priority (nice +10, once) before its first test outside the Ray
    group, so the Ray group's worker, its `zg` processes and the Ray cluster (started by that worker, at normal
    priority) get the CPUs when they want them: that group is the run's critical path, and the other workers'
    tests fill the time it spends waiting. Priority changes scheduling only, never what a test computes."""
    global _LOW_PRIORITY
    if _LOW_PRIORITY or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _schedule_rank(item) > 1:
        os.nice(10)
        _LOW_PRIORITY = True


def pytest_collection_finish(session):
    """Under `--dist loadgroup`, refuse to run if xdist did not turn the groups into node-id suffixes (it stops
    doing so, silently, with pytest 9.2: pytest-dev/pytest-xdist#1386): every worker would rebuild the shared
    fixtures, and the suite would take minutes longer with nothing failing."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not apply --dist loadgroup to {len(lost)} grouped tests "
            f"(e.g. {lost[0]}); install the pytest that pyproject.toml's [test] extra pins"
        )


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


PIPELINE_STAGES = ["teacher", "tokens", "materialize", "verify", "train@b00", "train@b01", "assemble", "evaluate"]


def _reproduce(base: Path) -> Path:
    """``base``/proj: a tiny project after `zg init`, a git commit, `dvc repro` of every stage and a second commit.

    Where strace is installed the `dvc repro` runs under it, one log per process in ``base``/trace
    (tests/stage_trace.py): tests/test_stage_deps.py reads what each stage opened from it, instead of running
    every stage again."""
    from stage_trace import repro

    root = base / "proj"
    zg("init", root, "--profile", "tiny", cwd=base)
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "zg init"], cwd=root)
    res = repro(["dvc", "repro"], root, base / "trace")
    ran = re.findall(r"Running stage '([^']+)'", res.stdout + res.stderr)
    assert ran == PIPELINE_STAGES, ran
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "dvc repro"], cwd=root)
    return root


@pytest.fixture(scope="session")
def reproduced_base(tmp_path_factory, worker_id) -> Path:
    """The run's one reproduced tiny project (``_reproduce``): the folder holding ``proj`` and, with strace,
    ``trace``. Read it, never change it: tests that need the project take ``reproduced``, a copy.

    Under pytest-xdist the first worker that needs it builds it in the run's shared temp folder while holding
    a lock; the others wait for it."""
    if worker_id == "master":  # not distributed: this process is the only user
        base = tmp_path_factory.mktemp("pipeline-base")
        _reproduce(base)
        return base
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above every worker's own
    done = shared / "reproduced.done"
    with open(shared / "reproduced.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():  # a worker that failed to build it left no mark: build it again, from scratch
            shutil.rmtree(shared / "reproduced", ignore_errors=True)
            (shared / "reproduced").mkdir()
            _reproduce(shared / "reproduced")
            done.touch()
    return shared / "reproduced"


@pytest.fixture(scope="session")
def reproduced(reproduced_base, tmp_path_factory) -> Path:
    """This worker's copy of the run's one reproduced tiny project (``reproduced_base``), so each worker's dvc
    and git commands have a repo of their own."""
    return shutil.copytree(reproduced_base / "proj", tmp_path_factory.mktemp("pipeline") / "proj", symlinks=True)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def tree_sha256(path: Path) -> str:
    """Hash of every file's relative name and content under ``path`` (unchanged-ness checks).

    ``.zg/`` (lock files and caches: runtime state, gitignored, never an output) is left out."""
    h = hashlib.sha256()
    path = Path(path)
    for p in sorted(x for x in path.rglob("*") if x.is_file() and ".zg" not in x.relative_to(path).parts):
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
    group runs first and in one piece on its worker (``pytest_collection_modifyitems``), and nothing after it uses
    the cluster; left up, its idle processes (GCS, raylet, warm workers) take about 8% of a core (5 CPU-seconds
    a minute, measured) while this worker and the others run the rest of the suite for minutes."""
    if _RAY_SHUTDOWN and (nextitem is None or not SHARED_FIXTURES & set(getattr(nextitem, "fixturenames", ()))):
        _RAY_SHUTDOWN.pop()()


@pytest.fixture(scope="session")
def ray_session(ray_cluster) -> str:
    """The address of the session's Ray cluster (``ray_cluster``), which this process is connected to."""
    return ray_cluster.address

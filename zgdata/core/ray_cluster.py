"""Ray at the edge: the one adapter through which zg joins, starts, sizes and leaves a Ray cluster.

Two modules run work on Ray and, with this one, are the only modules of zg that import ``ray``:
zgdata/materialize/ray_shards.py (materialize shards, ``materialize.workers`` > 1) and
zgtrain/exec/ray_tasks.py (blocks of `zg repro --jobs N`). Each is imported only when Ray is asked for,
and this module imports ``ray`` only inside ``connect``, ``remote`` and ``cancel``, so `dvc repro`, `zg repro --jobs 1`
and a one-worker materialize never import it.

- Cluster: the Ray instance this process already runs (a test's) is used as it is; else the one at
  ``ZG_RAY_ADDRESS`` (or Ray's own ``RAY_ADDRESS``) or the address given; else a local instance sized for
  the work, stopped again on exit. Only an instance this process connected to is shut down. A local
  instance also dies with a driver killed outright (kill -9, OOM): zgdata/core/ray_reaper.py watches for that.
- Retries: a task whose worker process dies (``kill -9``, out of memory, a lost node) runs again, up to
  ``MAX_RETRIES`` times; an exception the task raises is a result, never retried.
- Object store: tasks pass small JSON or dicts, so a local instance gets ``OBJECT_STORE_BYTES``, not Ray's
  default of 30% of RAM in /dev/shm.
- Environment: a joined cluster's workers were started elsewhere, with their own environment, so what the
  driver's says about the run travels with each task: `zg repro`'s block tasks get ``worker_env()`` and
  apply it; a materialize shard gets its device and test hooks in its spec.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator

from zgdata.errors import ZgError

__all__ = [
    "FORWARD",
    "MAX_RETRIES",
    "OBJECT_STORE_BYTES",
    "address",
    "cancel",
    "connect",
    "first_line",
    "last_line",
    "remote",
    "task_options",
    "worker_env",
]

MAX_RETRIES = 3  # worker deaths (kill -9, OOM) per task; an exception in the task is never retried
OBJECT_STORE_BYTES = 128 << 20
# the driver's environment variables that must hold in the workers too (besides every ZG_*)
FORWARD = ("HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")


def address() -> str | None:
    """The cluster to join: ``ZG_RAY_ADDRESS``, else Ray's own ``RAY_ADDRESS``, else None (start a local one)."""
    return os.environ.get("ZG_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or None


def worker_env() -> dict:
    """The part of this process's environment that a task applies in its worker (every ZG_* and ``FORWARD``)."""
    return {k: v for k, v in os.environ.items() if k.startswith("ZG_") or k in FORWARD}


def first_line(e: BaseException) -> str:
    """The first line of an error (Ray's messages run on for pages), at most 200 characters."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def last_line(e: BaseException) -> str:
    """``Type: last non-empty line`` of an error (a task's traceback ends with what went wrong)."""
    text = str(e).strip().splitlines()
    last = [ln for ln in text if ln.strip()][-1:] or [type(e).__name__]
    return f"{type(e).__name__}: {last[0][:300]}"


@contextlib.contextmanager
def connect(
    addr: str | None, *, cpus: int, gpus: int | None = None, error: Callable[[str | None, BaseException], ZgError]
) -> Iterator[dict]:
    """Use this process's Ray, join ``addr``, or start a local instance of ``cpus`` CPUs (and ``gpus`` GPUs;
    None: as many as Ray finds). Yields ``{"own": connected here, "started": a local instance started here}``;
    on exit disconnects (and so stops a local instance) when it connected. A failure to connect raises
    ``error(addr, exception)``."""
    import warnings

    import ray

    if ray.is_initialized():
        yield {"own": False, "started": False}
        return
    # Ray's node processes start through a fork with a preexec hook, where lance warns that it is not
    # fork-safe; they exec at once and never use lance, so the warning is noise on the CLI's stderr
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    kw = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    reaper = None
    try:
        if addr:
            ray.init(address=addr, **kw)
        else:  # "local": never some other cluster that happens to run on this machine
            if gpus is not None:
                kw["num_gpus"] = gpus
            reaper = _start_reaper()
            ray.init(address="local", num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES, **kw)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError ... for a bad address or setup
        _stop_reaper(reaper)
        raise error(addr, e) from e
    try:
        yield {"own": True, "started": not addr}
    finally:
        ray.shutdown()
        _stop_reaper(reaper)


def _start_reaper():
    """zgdata/core/ray_reaper.py in a session of its own (a Ctrl-C or kill of the driver's group leaves it to clean
    up), its stdin a pipe from this process: the pipe closes when this process ends, however it ends."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "zgdata.core.ray_reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop_reaper(reaper) -> None:
    if reaper is None:
        return
    reaper.stdin.close()  # after ray.shutdown: it kills only what is still running
    with contextlib.suppress(Exception):
        reaper.wait(timeout=10)


def task_options(*, cpus: int, gpus: int, name: str, **more) -> dict:
    """Ray task options: the resources one task holds, retries after worker deaths only, a name for Ray's views."""
    return {
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_retries": MAX_RETRIES,
        "retry_exceptions": False,
        "name": name,
        **more,
    }


def remote(fn: Callable, *, gpus: float):
    """``fn`` as a Ray remote function; where its tasks hold a GPU, each runs in a fresh worker process.

    A process keeps the CUDA device it first used, whatever ``CUDA_VISIBLE_DEVICES`` Ray sets for its next task, so a
    reused worker on a box of several GPUs would run on its old GPU beside another task, and keep its memory there.
    Ray makes GPU tasks single-use (``max_calls=1``) only when ``num_gpus`` is given to ``ray.remote`` itself; zg
    gives each task its resources through ``.options()`` (``task_options``), where ``max_calls`` cannot be set."""
    import ray

    return ray.remote(max_calls=1)(fn) if gpus else ray.remote(fn)


def cancel(refs: Iterable) -> None:
    """Force-cancel tasks still running (an error or an interrupt in the driver); never raises."""
    import ray

    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)

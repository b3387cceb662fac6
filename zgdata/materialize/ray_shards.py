"""Ray at the edge of materialize: run shard tasks, hand their results back in row order.

The only zgdata module that imports ``ray`` (lazily: only ``materialize.workers`` > 1 needs it).
The task itself is the plain function ``zgdata.materialize.shard_task.run_shard`` (JSON text in and out).

- Cluster: the Ray instance this process already runs (a test's), else the one at
  ``ZG_RAY_ADDRESS`` (or Ray's own ``RAY_ADDRESS``), else a local one started here with
  ``workers x worker_threads`` CPUs and stopped when materialize ends.
- At most ``workers`` tasks run at once, each asking Ray for ``worker_threads`` CPUs (and
  one GPU when ``ZG_DEVICE`` is CUDA; Ray then sets ``CUDA_VISIBLE_DEVICES``).
- A task whose worker process dies (``kill -9``, out of memory, a lost node) is retried by
  Ray up to ``MAX_RETRIES`` times; the dead attempt's files are never committed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Iterator

from zgdata.errors import ZgError

__all__ = ["cluster", "run_ordered", "ray_address", "MAX_RETRIES"]

MAX_RETRIES = 3
_OBJECT_STORE_BYTES = 128 << 20  # tasks return small JSON; the default (30% of RAM in /dev/shm) is wasted


def ray_address() -> str | None:
    return os.environ.get("ZG_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


@contextlib.contextmanager
def cluster(cpus: int) -> Iterator[None]:
    """Use this process's Ray, join ``ray_address()``, or start a local instance of ``cpus`` CPUs (stopped on exit)."""
    import warnings

    try:
        import ray
    except ImportError as e:
        raise ZgError("materialize.workers > 1 runs on Ray, which is not installed", key="materialize.workers",
                      fix="pip install 'ray>=2.60' (or set materialize.workers: 1)") from e
    if ray.is_initialized():
        yield
        return
    # Ray's node processes start through a fork with a preexec hook, where lance warns that it is not
    # fork-safe; they exec at once and never use lance, so the warning is noise on the CLI's stderr
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    addr = ray_address()
    kw = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    try:
        if addr:
            ray.init(address=addr, **kw)
        else:
            ray.init(address="local", num_cpus=cpus, object_store_memory=_OBJECT_STORE_BYTES, **kw)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError ... for a bad address or setup
        where = f"the Ray cluster at {addr}" if addr else "a local Ray instance"
        raise ZgError(f"materialize.workers > 1 could not start or join {where}: {_first_line(e)}",
                      key="materialize.workers",
                      fix="check ZG_RAY_ADDRESS (unset it to start a local instance), or set materialize.workers: 1"
                      ) from e
    try:
        yield
    finally:
        ray.shutdown()


def _check_resources(cpus: int, gpus: int) -> None:
    import ray

    have = ray.cluster_resources()
    if have.get("CPU", 0) < cpus or have.get("GPU", 0) < gpus:
        raise ZgError(f"the Ray cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs, but one "
                      f"shard task needs {cpus} CPUs and {gpus} GPUs", key="materialize.worker_threads",
                      fix="lower materialize.worker_threads, unset ZG_DEVICE for CPU, or join a bigger cluster")


def _result(ref, spec: dict) -> dict:
    import ray

    lo, hi = spec["lo"], spec["hi"]
    try:
        out = json.loads(ray.get(ref))
    except ray.exceptions.RayTaskError:
        raise  # a bug in the task: keep its traceback (user-fixable failures come back as JSON)
    except ray.exceptions.RayError as e:
        raise ZgError(f"materialize shard rows {lo}-{hi - 1} failed: its worker died {MAX_RETRIES + 1} times "
                      f"({type(e).__name__}: {_first_line(e)})",
                      fix="rerun `zg data materialize` (committed shards are kept); if the workers ran out of memory, "
                          "lower materialize.workers or materialize.batch_size") from e
    if "error" in out:
        err = out["error"]
        raise ZgError(err["what"], fix=err["fix"], key=err["key"], code=err.get("code", 2))
    return out


def run_ordered(specs: list[dict], *, workers: int, cpus: int, gpus: int) -> Iterator[dict]:
    """Run ``run_shard`` on every spec, ``workers`` at a time; yield each result once it and all before it are done."""
    import ray

    from zgdata.materialize.shard_task import run_shard

    _check_resources(cpus, gpus)
    task = ray.remote(run_shard).options(num_cpus=cpus, num_gpus=gpus, max_retries=MAX_RETRIES,
                                         retry_exceptions=False, name="zg-materialize-shard")
    running: dict = {}  # ref -> index
    done: dict[int, dict] = {}
    submitted = following = 0
    try:
        while following < len(specs):
            while submitted < len(specs) and len(running) < workers:
                running[task.remote(json.dumps(specs[submitted]))] = submitted
                submitted += 1
            if following in done:
                yield done.pop(following)
                following += 1
                continue
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                i = running.pop(ref)
                done[i] = _result(ref, specs[i])
    finally:
        for ref in running:  # an error or an interrupt: stop what still runs (its files are never committed)
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)

"""Ray at the edge of materialize: run shard tasks, hand their results back in row order.

With zgdata/core/ray_cluster.py (the cluster: connect, retries, object store) and zgtrain/exec/ray_tasks.py, one of
the three modules of zg that import ``ray``; imported only when ``materialize.workers`` > 1 needs it.
The task itself is the plain function ``zgdata.materialize.shard_task.run_shard`` (JSON text in and out).

- Cluster: the Ray instance this process already runs (a test's), else the one at
  ``ZG_RAY_ADDRESS`` (or Ray's own ``RAY_ADDRESS``), else a local one started here with
  ``workers x worker_threads`` CPUs and stopped when materialize ends (``ray_cluster.connect``).
- At most ``workers`` tasks run at once, each asking Ray for ``worker_threads`` CPUs (and
  one GPU when ``ZG_DEVICE`` is CUDA; Ray then sets ``CUDA_VISIBLE_DEVICES``).
- A task whose worker process dies (``kill -9``, out of memory, a lost node) is retried by
  Ray up to ``MAX_RETRIES`` times; the dead attempt's files are never committed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from zgdata.core import ray_cluster
from zgdata.core.ray_cluster import MAX_RETRIES, first_line
from zgdata.errors import ZgError
from zgdata.materialize.shard_task import run_shard

__all__ = ["cluster", "run_ordered", "MAX_RETRIES"]


def _connect_error(addr: str | None, e: BaseException) -> ZgError:
    where = f"the Ray cluster at {addr}" if addr else "a local Ray instance"
    return ZgError(
        f"materialize.workers > 1 could not start or join {where}: {first_line(e)}",
        key="materialize.workers",
        fix="check ZG_RAY_ADDRESS (unset it to start a local instance), or set materialize.workers: 1",
    )


@contextlib.contextmanager
def cluster(cpus: int) -> Iterator[None]:
    """This process's Ray, the cluster at ``ray_cluster.address()``, or a local one of ``cpus`` CPUs (stopped on exit)."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise ZgError(
            "materialize.workers > 1 runs on Ray, which is not installed",
            key="materialize.workers",
            fix="pip install 'ray>=2.60' (or set materialize.workers: 1)",
        ) from e
    with ray_cluster.connect(ray_cluster.address(), cpus=cpus, error=_connect_error):
        yield


def _check_resources(cpus: int, gpus: int) -> None:
    import ray

    have = ray.cluster_resources()
    if have.get("CPU", 0) < cpus or have.get("GPU", 0) < gpus:
        raise ZgError(
            f"the Ray cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs, but one "
            f"shard task needs {cpus} CPUs and {gpus} GPUs",
            key="materialize.worker_threads",
            fix="lower materialize.worker_threads, unset ZG_DEVICE for CPU, or join a bigger cluster",
        )


def _result(ref, spec: dict) -> dict:
    import ray

    lo, hi = spec["lo"], spec["hi"]
    try:
        out = json.loads(ray.get(ref))
    except ray.exceptions.RayTaskError:
        raise  # a bug in the task: keep its traceback (user-fixable failures come back as JSON)
    except ray.exceptions.RayError as e:
        raise ZgError(
            f"materialize shard rows {lo}-{hi - 1} failed: its worker died {MAX_RETRIES + 1} times "
            f"({type(e).__name__}: {first_line(e)})",
            fix="rerun `zg data materialize` (committed shards are kept); if the workers ran out of memory, "
            "lower materialize.workers or materialize.batch_size",
        ) from e
    if "error" in out:
        err = out["error"]
        raise ZgError(err["what"], fix=err["fix"], key=err["key"], code=err.get("code", 2))
    return out


def run_ordered(specs: list[dict], *, workers: int, cpus: int, gpus: int) -> Iterator[dict]:
    """Run ``run_shard`` on every spec, ``workers`` at a time; yield each result once it and all before it are done."""
    import ray

    _check_resources(cpus, gpus)
    opts = ray_cluster.task_options(cpus=cpus, gpus=gpus, name="zg-materialize-shard")
    task = ray_cluster.remote(run_shard, gpus=gpus).options(**opts)
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
        ray_cluster.cancel(running)  # an error or an interrupt: stop what still runs (its files are never committed)

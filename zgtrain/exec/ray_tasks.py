"""Ray at the edge of `zg repro`: blocks as Ray tasks (`zg repro --jobs N`, N > 1, or --address).

With zgdata/core/ray_cluster.py (the cluster: connect, retries, object store, worker environment) and
zgdata/materialize/ray_shards.py, one of the three modules of zg that import Ray; zgtrain/exec/repro.py
imports this one only when Ray is asked for. Each stale block becomes one Ray task that calls the plain stage
function ``zgtrain.exec.stage.train_one`` (or, for nodes without the project's file system,
``zgtrain.exec.scratch.train_in_scratch``). A task asks Ray for what it
uses: ``train.threads`` CPUs, plus one GPU when ZG_DEVICE is CUDA (Ray then sets CUDA_VISIBLE_DEVICES, so the
task's device is plain ``cuda``). A worker killed mid-block is retried (``max_retries``); the retry resumes
from the block's last checkpoint. The driver keeps at most ``jobs`` blocks in flight, collects progress from
a small actor, and hands each finished block to ``on_result`` (which records it in dvc.lock) one at a time.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import ray

from zgdata.core import ray_cluster
from zgdata.core.ray_cluster import MAX_RETRIES, last_line
from zgdata.core.runtime import use_assigned_gpu
from zgdata.errors import ZgError
from zgtrain.exec.scratch import train_in_scratch
from zgtrain.exec.stage import train_one

__all__ = ["run_blocks", "MAX_RETRIES"]


@ray.remote(num_cpus=0)
class _Inbox:
    """Progress updates from the tasks; the driver drains it about once a second."""

    def __init__(self):
        self.items: list[dict] = []

    def put(self, item: dict) -> None:
        self.items.append(item)

    def take(self) -> list[dict]:
        items, self.items = self.items, []
        return items


def _block_task(root: str, key: str, env: dict, inbox, data: str, source: dict | None) -> dict:
    os.environ.update(env)
    use_assigned_gpu()
    ctx = ray.get_runtime_context()
    here = {"node": f"{ray.util.get_node_ip_address()}/{ctx.get_node_id()[:8]}"}

    def report(u: dict) -> None:
        inbox.put.remote({**u, **here})

    if data == "remote":
        r = train_in_scratch(source, key, report=report)
    else:
        r = train_one(root, key, report=report)
    return {**r, **here}


def _connect_error(address: str | None, e: BaseException) -> ZgError:
    where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
    return ZgError(
        f"zg repro could not {where} ({last_line(e)})",
        key="--address",
        fix="check --address / ZG_RAY_ADDRESS (see docs/SCALE.md), or use --jobs 1",
    )


def _local_size(jobs: int, needs: dict[str, dict]) -> tuple[int, int]:
    """CPUs and GPUs of a local Ray sized for JOBS blocks at once."""
    cpus = jobs * max(n["cpus"] for n in needs.values())
    gpus = jobs if any(n["gpus"] for n in needs.values()) else 0
    if gpus:
        import torch

        gpus = min(gpus, torch.cuda.device_count())
    return cpus, gpus


def _check_nodes(needs: dict[str, dict]) -> dict:
    """Refuse a block that no node can hold; returns the cluster's address and number of live nodes."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    for k, n in needs.items():
        if n["cpus"] > max((x["Resources"].get("CPU", 0) for x in nodes), default=0) or (
            n["gpus"] and not total.get("GPU")
        ):
            what = f"{n['gpus']} GPU" if n["gpus"] and not total.get("GPU") else f"{n['cpus']} CPUs"
            raise ZgError(
                f"block {k} needs {what} but no node of the Ray cluster has that many",
                key=f"blocks.{k}.threads" if not n["gpus"] else "ZG_DEVICE",
                fix="unset ZG_DEVICE to train on the CPU, or join a cluster with a GPU node"
                if n["gpus"] and not total.get("GPU")
                else "lower train.threads (or blocks.KEY.threads), or add bigger nodes",
            )
    return {"address": ray.get_runtime_context().gcs_address, "nodes": len(nodes)}


def run_blocks(
    root: Path,
    keys: list[str],
    *,
    needs: dict[str, dict],
    jobs: int,
    address: str | None,
    on_update: Callable[[dict], None],
    on_result: Callable[[dict], None],
    data: str = "shared",
    source: dict | None = None,
) -> dict:
    """Train KEYS as Ray tasks, at most JOBS at once; returns where they ran (address, nodes)."""
    # Ray prints its own notices (e.g. "(raylet) A worker died ...") on stdout, which is zg's for results
    with contextlib.redirect_stdout(sys.stderr):
        return _run(
            root,
            keys,
            needs=needs,
            jobs=jobs,
            address=address,
            on_update=on_update,
            on_result=on_result,
            data=data,
            source=source,
        )


def _run(root, keys, *, needs, jobs, address, on_update, on_result, data, source) -> dict:
    cpus, gpus = (0, 0) if address else _local_size(jobs, needs)
    with ray_cluster.connect(address, cpus=cpus, gpus=gpus, error=_connect_error) as conn:
        info = {**_check_nodes(needs), "started": conn["started"]}  # a refused block: disconnects on the way out
        inbox, pending = None, {}
        try:
            inbox = _Inbox.remote()
            tasks = {g: ray_cluster.remote(_block_task, gpus=g) for g in {needs[k]["gpus"] for k in keys}}
            env, queue = ray_cluster.worker_env(), list(keys)
            while queue or pending:
                while queue and len(pending) < jobs:
                    k = queue.pop(0)
                    opts = ray_cluster.task_options(
                        cpus=needs[k]["cpus"], gpus=needs[k]["gpus"], name=f"train@{k}", scheduling_strategy="SPREAD"
                    )
                    task = tasks[needs[k]["gpus"]]
                    pending[task.options(**opts).remote(str(root), k, env, inbox, data, source)] = k
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                with contextlib.suppress(ray.exceptions.RayError):  # progress only: results still arrive without it
                    for u in ray.get(inbox.take.remote()):
                        on_update(u)
                for ref in ready:
                    k = pending.pop(ref)
                    try:
                        r = ray.get(ref)
                    except ray.exceptions.RayError as e:  # a bug in the task, or the worker died MAX_RETRIES + 1 times
                        r = {
                            "key": k,
                            "status": "failed",
                            "error": last_line(getattr(e, "cause", None) or e),
                            "error_key": f"blocks.{k}",
                            "fix": "",
                            "pid": None,
                        }
                    on_result(r)
        finally:
            ray_cluster.cancel(pending)  # an error or an interrupt in the driver: stop what still runs
            if inbox is not None:
                with contextlib.suppress(Exception):
                    ray.kill(inbox)
    return info

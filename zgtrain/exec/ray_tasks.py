"""Ray at the edge: the only module of zg that imports Ray (`zg repro --jobs N`, N > 1, or --address).

Each stale block becomes one Ray task that calls the plain stage function ``zgtrain.exec.repro.train_one`` (or, for
nodes without the project's file system, ``zgtrain.exec.scratch.train_in_scratch``). A task asks Ray for what it
uses: ``train.threads`` CPUs, plus one GPU when ZG_DEVICE is CUDA (Ray then sets CUDA_VISIBLE_DEVICES, so the
task's device is plain ``cuda``). A worker killed mid-block is retried (``max_retries``); the retry resumes
from the block's last checkpoint. The driver keeps at most ``jobs`` blocks in flight, collects progress from
a small actor, and hands each finished block to ``on_result`` (which records it in dvc.lock) one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Callable

import ray

from zgdata.errors import ZgError

__all__ = ["run_blocks", "MAX_RETRIES"]

MAX_RETRIES = 3  # worker deaths (kill -9, OOM) per block; a ZgError is a result, never retried
_OBJECT_STORE = 128 * 1024 * 1024  # zg passes only small dicts through Ray
# What the driver's environment says about the run and must hold in the workers too (a joined cluster's
# workers were started elsewhere, with their own environment).
_FORWARD = ("HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")


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
    if os.environ.get("ZG_DEVICE", "cpu").startswith("cuda"):
        os.environ["ZG_DEVICE"] = "cuda"  # Ray made the assigned GPU the only visible one
    ctx = ray.get_runtime_context()
    here = {"node": f"{ray.util.get_node_ip_address()}/{ctx.get_node_id()[:8]}"}

    def report(u: dict) -> None:
        inbox.put.remote({**u, **here})

    if data == "remote":
        from zgtrain.exec.scratch import train_in_scratch

        r = train_in_scratch(source, key, report=report)
    else:
        from zgtrain.exec.repro import train_one

        r = train_one(root, key, report=report)
    return {**r, **here}


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith("ZG_") or k in _FORWARD}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    last = [ln for ln in text if ln.strip()][-1:] or [type(e).__name__]
    return f"{type(e).__name__}: {last[0][:300]}"


def _connect(address: str | None, jobs: int, needs: dict[str, dict]) -> dict:
    """Join ADDRESS, or start a local Ray sized for JOBS blocks (address "local": never some other cluster
    that happens to run on this machine). A Ray this process already runs (a test's) is used as it is."""
    import warnings

    warnings.filterwarnings("ignore", message="lance is not fork-safe")  # Ray's node processes exec at once
    kw = dict(logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    own = not ray.is_initialized()  # whether this call connects (and so disconnects at the end)
    try:
        if not own:
            pass
        elif address:
            ray.init(address=address, **kw)
        else:
            cpus = jobs * max(n["cpus"] for n in needs.values())
            gpus = jobs if any(n["gpus"] for n in needs.values()) else 0
            if gpus:
                import torch

                gpus = min(gpus, torch.cuda.device_count())
            ray.init(address="local", num_cpus=cpus, num_gpus=gpus, object_store_memory=_OBJECT_STORE, **kw)
    except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError ... for a bad address or setup
        where = f"join the Ray cluster at {address}" if address else "start a local Ray instance"
        raise ZgError(f"zg repro could not {where} ({_one_line(e)})", key="--address",
                      fix="check --address / ZG_RAY_ADDRESS (see docs/SCALE.md), or use --jobs 1") from e
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    for k, n in needs.items():
        if n["cpus"] > max((x["Resources"].get("CPU", 0) for x in nodes), default=0) or \
                (n["gpus"] and not total.get("GPU")):
            if own:
                ray.shutdown()
            what = f"{n['gpus']} GPU" if n["gpus"] and not total.get("GPU") else f"{n['cpus']} CPUs"
            raise ZgError(f"block {k} needs {what} but no node of the Ray cluster has that many",
                          key=f"blocks.{k}.threads" if not n["gpus"] else "ZG_DEVICE",
                          fix="lower train.threads (or blocks.KEY.threads), or add bigger nodes")
    return {"address": ray.get_runtime_context().gcs_address, "nodes": len(nodes),
            "started": own and not address, "own": own}


def run_blocks(root: Path, keys: list[str], *, needs: dict[str, dict], jobs: int, address: str | None,
               on_update: Callable[[dict], None], on_result: Callable[[dict], None], data: str = "shared",
               source: dict | None = None) -> dict:
    """Train KEYS as Ray tasks, at most JOBS at once; returns where they ran (address, nodes)."""
    # Ray prints its own notices (e.g. "(raylet) A worker died ...") on stdout, which is zg's for results
    with contextlib.redirect_stdout(sys.stderr):
        return _run(root, keys, needs=needs, jobs=jobs, address=address, on_update=on_update, on_result=on_result,
                    data=data, source=source)


def _run(root, keys, *, needs, jobs, address, on_update, on_result, data, source) -> dict:
    info = _connect(address, jobs, needs)
    own = info.pop("own")
    inbox, pending = None, {}
    try:
        inbox = _Inbox.remote()
        task = ray.remote(_block_task)
        env, queue = _env(), list(keys)
        while queue or pending:
            while queue and len(pending) < jobs:
                k = queue.pop(0)
                ref = task.options(num_cpus=needs[k]["cpus"], num_gpus=needs[k]["gpus"], max_retries=MAX_RETRIES,
                                   retry_exceptions=False, name=f"train@{k}", scheduling_strategy="SPREAD").remote(
                    str(root), k, env, inbox, data, source)
                pending[ref] = k
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            with contextlib.suppress(ray.exceptions.RayError):  # progress only: results still arrive without it
                for u in ray.get(inbox.take.remote()):
                    on_update(u)
            for ref in ready:
                k = pending.pop(ref)
                try:
                    r = ray.get(ref)
                except ray.exceptions.RayError as e:  # a bug in the task, or the worker died MAX_RETRIES + 1 times
                    r = {"key": k, "status": "failed", "error": _one_line(getattr(e, "cause", None) or e),
                         "error_key": f"blocks.{k}", "fix": "", "pid": None}
                on_result(r)
    finally:
        for ref in pending:  # an error or an interrupt in the driver: stop what still runs
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if inbox is not None:
            with contextlib.suppress(Exception):
                ray.kill(inbox)
        if own:
            ray.shutdown()
    return info

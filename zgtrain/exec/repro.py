"""`zg repro`: the end state of `dvc repro`, with the stale blocks trained at the same time.

DVC has no parallel repro (two `dvc repro` in one repo fail on its lock), so the driver does this:

1. It asks DVC's index which stages the targets need, and `dvc status --json` which blocks are stale.
2. It runs the stages upstream of the blocks (teacher, tokens, materialize, verify) with plain `dvc repro`.
3. It trains every stale `train@KEY` with ``train_one`` (zgtrain/exec/stage.py), the stage function `zg train
   block KEY` runs: in this process with ``--jobs 1``, otherwise as Ray tasks (zgtrain/exec/ray_tasks.py, on a
   cluster joined or started by zgdata/core/ray_cluster.py; Ray is imported only then).
4. It records each finished block in dvc.lock with `dvc commit -f train@KEY`, one at a time, here in the
   driver. A killed driver therefore loses no recorded block, and a rerun trains only what is not recorded.
5. It runs what is left (assemble, evaluate, or the targets) with plain `dvc repro`.

Afterwards `dvc status` is clean and dvc.lock holds the hashes a serial `dvc repro` writes (the blocks' bits are
the same: same stage function, same params, same ``train.threads``).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from zgdata.core import ray_cluster
from zgdata.core.lock import project_lock
from zgdata.core.runtime import device_type
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.exec import scratch
from zgtrain.exec.dvc_locks import OutputLocks, local_deps
from zgtrain.exec.progress_view import Monitor, summary_lines
from zgtrain.exec.stage import dvc, train_one
from zgtrain.project.config import ProjectConfig

__all__ = ["repro", "plan", "Plan", "ReproResult", "stale_stages"]

_RAN = re.compile(r"Running stage '([^']+)'")
_RESTORED = re.compile(r"Stage '([^']+)' is cached - skipping run")  # DVC's run cache had the outputs


@dataclass
class Plan:
    """What the targets need, by phase: plain-DVC stages before the blocks, the blocks, and the rest."""

    pre: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    post: list[str] = field(default_factory=list)
    deps: dict[str, list[str]] = field(default_factory=dict)  # per block stage: what it reads (dvc_locks.local_deps)


@dataclass(frozen=True, kw_only=True)
class ReproResult:
    """What `zg repro` did; ``metrics()`` is what `zg repro --json` prints."""

    ran: list
    """The stages that ran, in order: DVC's and the blocks recorded here (`train@KEY`)."""
    restored: list
    """The stages DVC restored from its run cache instead of running."""
    blocks: dict
    """Per stale block key: ``train_one``'s result (with the host, pid, threads, seconds, peak RSS)."""
    jobs: int
    cluster: dict | None
    """The Ray cluster the blocks ran on (None: in this process)."""
    seconds: float

    def metrics(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def plan(root: Path, targets: list[str]) -> Plan:
    """Split the stages the targets need (all stages without targets) around the `train@KEY` stages."""
    import networkx as nx
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        order = [s.addressing for s in repo.index.stages]
        needed: set[str] = set()
        for t in targets or order:
            try:
                needed |= {s.addressing for s in repo.stage.collect(t, with_deps=True)}
            except DvcException as e:
                raise ZgError(
                    f"target '{t}' is not a stage of {root / 'dvc.yaml'} ({e})",
                    key="TARGETS",
                    fix=f"use stage names: {', '.join(order)}",
                ) from e
        name = {s: s.addressing for s in graph.nodes}
        blocks = [s for s in graph.nodes if name[s].startswith("train@") and name[s] in needed]
        after = {name[a] for b in blocks for a in nx.ancestors(graph, b)}  # stages that depend on a block
        deps = {name[b]: local_deps(b) for b in blocks}
    p = Plan(deps=deps)
    for s in order:
        if s not in needed:
            continue
        (p.blocks if s.startswith("train@") else p.post if s in after else p.pre).append(s)
    return p


def stale_stages(root: Path, stages: list[str]) -> list[str]:
    """The stages among STAGES that `dvc status` reports changed, in the given order (DVC's Python API)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    if not stages:
        return []
    try:
        with Repo(str(root)) as repo:
            changed = repo.status(targets=stages)
    except DvcException as e:
        raise ZgError(
            f"`dvc status` failed in {root}: {str(e)[:300]}",
            fix="run `dvc status` yourself to see what is wrong, fix it, then rerun `zg repro`",
        ) from e
    return [s for s in stages if s in changed]


def _own_keys(project: ProjectConfig, key: str) -> list[str]:
    """blocks.KEY.* overrides in params.yaml: the likely culprits when only block KEY fails."""
    run = project.blocks.get(key)
    return [f"blocks.{key}.{k}" for k in (run.overrides if run else ())]


def _failure(project: ProjectConfig, failed: list[dict], recorded: list[str], post: list[str]) -> ZgError:
    parts, keys = [], []
    for r in failed:
        k = r.get("error_key") or f"blocks.{r['key']}"
        own = _own_keys(project, r["key"])
        if k == f"blocks.{r['key']}" and own:
            k = ", ".join(own)
        keys.append(k)
        fix = f" ({r['fix'].rstrip('.')})" if r.get("fix") else ""
        named = f" [{k}]" if parts else ""  # the first one's key leads the whole line
        parts.append(f"train@{r['key']} failed{named}: {r['error'].rstrip('.')}{fix}")
    rec = f"recorded in dvc.lock: {', '.join(recorded)}" if recorded else "no block was recorded"
    skipped = f"; not run: {', '.join(post)}" if post else ""
    return ZgError(
        f"{'; '.join(parts)}; {rec}{skipped}",
        key=keys[0],
        fix="fix the failed block's params, then rerun `zg repro`: recorded blocks do not run again",
    )


def _changed(key: str, at_start: ProjectConfig, now: ProjectConfig) -> list[str]:
    """The params keys of block KEY's stage that differ between the two loads of params.yaml (none: it may be
    recorded). A train field counts unless the stage leaves it out (``TrainConfig.UNRECORDED``)."""
    if key not in now.blocks:
        return [f"blocks.{key}"]
    a, b = at_start.blocks[key], now.blocks[key]
    out = ["seed"] if now.seed != at_start.seed else []
    out += [
        f"blocks.{key}.{k}" for k, f in (("in", "input"), ("out", "output")) if getattr(a.spec, f) != getattr(b.spec, f)
    ]
    for f in fields(a.train):
        if f.name not in type(a.train).UNRECORDED and getattr(a.train, f.name) != getattr(b.train, f.name):
            out.append(f"blocks.{key}.{f.name}" if f.name in b.overrides else f"train.{f.name}")
    return out


def _record(root: Path, key: str, at_start: ProjectConfig) -> None:
    """`dvc commit -f train@KEY`, after checking that the block's params did not change while it trained."""
    if changed := _changed(key, at_start, ProjectConfig.load(Layout(root).params)):
        raise ZgError(
            f"params of block {key} changed in params.yaml while zg repro trained it ({', '.join(changed)}); not "
            f"recording it",
            key=changed[0],
            fix="rerun `zg repro`: it retrains the block with the params now there",
        )
    dvc(root, "commit", "-f", f"train@{key}")


def _use_ray(jobs: int, address: str | None, n: int, data: str) -> bool:
    return address is not None or data == "remote" or (jobs > 1 and n > 1)


def repro(
    root: Path, targets: list[str], *, jobs: int = 1, address: str | None = None, data: str = "shared"
) -> ReproResult:
    """Bring the targets (all stages by default) up to date like `dvc repro`, with up to JOBS blocks at once."""
    root = Path(root).resolve()
    layout = Layout(root)
    if jobs < 1:
        raise ZgError(f"--jobs is {jobs}", key="--jobs", fix="give a number of blocks to train at once, >= 1")
    if data not in ("shared", "remote"):
        raise ZgError(f"--data is {data!r}", key="--data", fix="use shared (one file system) or remote (DVC remote)")
    if not (root / "dvc.yaml").exists():
        raise ZgError(f"{root} has no dvc.yaml", fix="run zg repro in a project root (see `zg init`)")
    project = ProjectConfig.load(layout.params)  # invalid params fail here, before any stage runs
    dev = device_type()  # checked before any stage runs; torch loads only for a device other than the CPU
    # one driver per project: a second `zg repro` is refused at once with the first one's pid
    with project_lock(layout, "repro", writes=root / "dvc.lock", errors_at=root):
        return _repro(root, layout, project, dev, targets, jobs=jobs, address=address, data=data)


def _on_ray(root: Path, project: ProjectConfig, dev, keys: list[str], jobs, address, data, on_update, on_result):
    """Train KEYS as Ray tasks (one block per task, its train.threads CPUs, a GPU where the device is one); the
    cluster's summary."""
    try:
        from zgtrain.exec import ray_tasks as ray_exec
    except ImportError as e:
        raise ZgError(
            f"zg repro --jobs {jobs} needs Ray, which is not installed ({e})",
            key="--jobs",
            fix="pip install 'zerograph[ray]' (make setup-dev does), or use --jobs 1",
        ) from e
    needs = {k: {"cpus": project.block(k).train.threads, "gpus": 1 if dev == "cuda" else 0} for k in keys}
    source = scratch.prepare(root, keys, project) if data == "remote" else None
    return ray_exec.run_blocks(
        root,
        keys,
        needs=needs,
        jobs=jobs,
        address=address or ray_cluster.address(),
        data=data,
        source=source,
        on_update=on_update,
        on_result=on_result,
    )


def _report(project: ProjectConfig, results: dict, keys: list[str], recorded: list[str], cluster, post) -> None:
    """Print each block's line to stderr; raise the one-line failure when a block did not finish."""
    failed = [results[k] for k in keys if results[k].get("status") != "done"]
    for line in summary_lines(results, cluster):
        print(line, file=sys.stderr)
    if failed:
        raise _failure(project, failed, recorded, post)


def _train_blocks(
    root: Path, layout: Layout, project: ProjectConfig, dev, keys: list[str], reads: list[str], jobs, address, data
):
    """Train the stale blocks KEYS (on Ray, or one after another here) under DVC's locks on their outputs and on
    what they read (READS), recording each finished one; (results by key, the stages recorded, the Ray cluster's
    summary)."""
    results: dict[str, dict] = {}
    recorded: list[str] = []
    cluster = None
    locks = OutputLocks(root)  # a `dvc repro` started meanwhile stops before it deletes a block being trained
    try:
        if keys:  # ... or rewrites what a block reads (held until every block is recorded)
            locks.hold("the blocks' inputs", [], read=reads)
        for k in keys:
            locks.hold(f"train@{k}", [layout.block_dir(k), layout.block_metrics(k), layout.block_loss_curve(k)])
        if keys:
            monitor = Monitor()

            def finished(r: dict) -> None:  # in the driver, one block at a time
                monitor.finished(r)
                locks.release(f"train@{r['key']}")  # dvc commit takes the block's locks itself
                if r.get("status") == "done":
                    try:
                        if data == "remote":
                            scratch.receive(root, r, project)
                            r = {k: v for k, v in r.items() if k not in ("lock_entry", "uncached")}
                        _record(root, r["key"], project)
                        recorded.append(f"train@{r['key']}")
                    except ZgError as e:
                        r = {**r, "status": "failed", "error": e.what, "error_key": e.key, "fix": e.fix}
                results[r["key"]] = r

            with monitor:
                if _use_ray(jobs, address, len(keys), data):
                    cluster = _on_ray(root, project, dev, keys, jobs, address, data, monitor.update, finished)
                else:
                    for k in keys:
                        finished(train_one(root, k, report=monitor.update))
    finally:
        locks.close()
    return results, recorded, cluster


def _repro(
    root: Path,
    layout: Layout,
    project: ProjectConfig,
    dev,
    targets: list[str],
    *,
    jobs: int,
    address: str | None,
    data: str,
) -> ReproResult:
    t0 = time.monotonic()
    p = plan(root, targets)
    ran: list[str] = []
    restored: list[str] = []

    def dvc_repro(*stages: str) -> None:
        out = dvc(root, "repro", *stages, echo=True)
        ran.extend(_RAN.findall(out))
        restored.extend(_RESTORED.findall(out))

    stale = stale_stages(root, p.pre + p.blocks + p.post)  # only direct changes: a rerun stage makes more stale
    if set(stale) & set(p.pre):
        dvc_repro(*p.pre)
        stale = stale_stages(root, p.blocks + p.post)
    keys = [s.split("@", 1)[1] for s in stale if s in p.blocks]
    reads = list(dict.fromkeys(d for k in keys for d in p.deps[f"train@{k}"]))
    results, recorded, cluster = _train_blocks(root, layout, project, dev, keys, reads, jobs, address, data)
    ran += recorded
    _report(project, results, keys, recorded, cluster, p.post)
    if ran or restored or set(stale) & set(p.post):
        dvc_repro(*targets)
    return ReproResult(
        ran=ran, restored=restored, blocks=results, jobs=jobs, cluster=cluster, seconds=time.monotonic() - t0
    )

"""The remote data plane of `zg repro --data remote`: workers that cannot see the project's file system.

The DVC remote carries the data (the sharing path of docs/SHARING.md, reused):

- ``prepare`` (driver): checks that the project has a git remote (``origin``) and a default DVC remote, pushes
  what the stale blocks need (each block's boundary pair and teacher slice), and describes the source: git URL,
  the driver's commit, and the driver's params.yaml, dvc.yaml and dvc.lock (small files that may hold changes
  made since the commit, e.g. the boundaries just recorded by the stages before the blocks).
- ``train_in_scratch`` (worker): clones the repository at that commit into a scratch directory, lays the
  driver's pipeline files over it, `dvc pull`s only its pair and slice, trains with ``train_one``
  (zgtrain/exec/stage.py), records the block in the clone (`dvc commit`) and `dvc push`es it. It returns the block's dvc.lock entry and the small
  uncached outputs (metrics, loss curve). The scratch directory is keyed by (URL, commit, the pipeline files laid
  over it, block), so a retried task on the same node resumes from the block's checkpoint, and two drivers at one
  commit with other uncommitted params never share one; it is removed once the block is pushed.
- ``receive`` (driver): writes the uncached outputs, enters the worker's dvc.lock entry and `dvc pull`s the block
  directory from the remote, then checks what came: the folder's files against the worker's entry (zg hashes
  them: a remote that serves another file list under the entry's md5 is caught), and its meta.json against what
  the worker reported (state) and what the driver's params ask (config, seed). Anything wrong, or a failed
  pull, puts back the driver's dvc.lock, uncached outputs and block folder as they were. The caller then records
  it with `dvc commit` (which rehashes what it pulled).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from zgdata.core.atomic import write_text
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.yamlio import safe_load
from zgtrain.exec.stage import dvc, dvc_logging, train_one
from zgtrain.project.config import ProjectConfig

__all__ = ["prepare", "train_in_scratch", "receive", "PIPELINE_FILES"]

PIPELINE_FILES = ("params.yaml", "dvc.yaml", "dvc.lock")


def _git(root: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if res.returncode:
        raise ZgError(
            f"`git {' '.join(args)}` failed in {root}: {(res.stderr or res.stdout).strip()[:300]}",
            fix="zg repro --data remote needs a git repository with a remote the workers can reach",
        )
    return res.stdout.strip()


def _inputs(project: ProjectConfig, key: str) -> list[str]:
    from zgdata.materialize.virtual import is_virtual

    spec, layout = project.block(key).spec, Layout(Path(""))
    first = (
        [str(layout.tokens), str(layout.teacher_head)]
        if is_virtual(spec.input, project.partition, project.materialize)
        else [str(layout.boundary(spec.input))]
    )  # a virtual h00 is computed from these (zgdata/materialize/virtual.py)
    return first + [str(layout.boundary(spec.output)), str(layout.teacher_slice(key))]


def prepare(root: Path, keys: list[str], project: ProjectConfig) -> dict:
    """Check the git and DVC remotes, push every block's inputs, and describe the source for the workers."""
    url = _git(root, "remote", "get-url", "origin") if "origin" in _git(root, "remote").split() else ""
    if not url:
        raise ZgError(
            f"{root} has no git remote 'origin' for the workers to clone",
            key="--data",
            fix="git remote add origin URL && git push origin HEAD (or use --data shared)",
        )
    if not dvc(root, "remote", "default").strip():
        raise ZgError(
            f"{root} has no default DVC remote for the workers to pull from",
            key="--data",
            fix="dvc remote add -d NAME URL, commit .dvc/config and push it (docs/SHARING.md)",
        )
    rev = _git(root, "rev-parse", "HEAD")
    paths = sorted({p for k in keys for p in _inputs(project, k)})
    dvc(root, "push", *paths)
    files = {f: (root / f).read_text() for f in PIPELINE_FILES if (root / f).exists()}
    return {"url": url, "rev": rev, "files": files, "inputs": {k: _inputs(project, k) for k in keys}}


def _scratch(source: dict, key: str) -> Path:
    base = Path(os.environ.get("ZG_SCRATCH") or Path(tempfile.gettempdir()) / "zg-scratch")
    files = "\0".join(f"{name}\0{text}" for name, text in sorted(source["files"].items()))
    tag = hashlib.sha256(f"{source['url']}\0{source['rev']}\0{files}\0{key}".encode()).hexdigest()[:16]
    return base / f"{key}-{tag}"


def _checkout(source: dict, d: Path) -> None:
    if (d / ".git").exists() and _git(d, "rev-parse", "HEAD") == source["rev"]:
        return  # a retry on this node: keep the clone and the block's checkpoint in it
    shutil.rmtree(d, ignore_errors=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    _git(d.parent, "clone", "--quiet", "--no-checkout", source["url"], d.name)
    try:
        _git(d, "checkout", "--quiet", source["rev"])
    except ZgError as e:
        raise ZgError(
            f"commit {source['rev'][:12]} is not in {source['url']}",
            key="--data",
            fix="git push the commit you run zg repro at, then rerun",
        ) from e


def train_in_scratch(source: dict, key: str, report: Callable[[dict], None] | None = None) -> dict:
    """Clone, pull block KEY's inputs, train it, push it; return its dvc.lock entry and uncached outputs."""
    d = _scratch(source, key)
    try:
        _checkout(source, d)
        for name, text in source["files"].items():
            (d / name).write_text(text)
        dvc(d, "pull", *source["inputs"][key])
    except ZgError as e:
        return {"key": key, "status": "failed", "error": e.what, "error_key": e.key, "fix": e.fix}
    r = train_one(d, key, report=report)
    if r.get("status") != "done":
        return r
    try:
        dvc(d, "commit", "-f", f"train@{key}")
        dvc(d, "push", f"train@{key}")
        entry = safe_load((d / "dvc.lock").read_text())["stages"][f"train@{key}"]
        uncached = {o["path"]: (d / o["path"]).read_text() for o in entry.get("outs", []) if (d / o["path"]).is_file()}
    except ZgError as e:
        return {**r, "status": "failed", "error": e.what, "error_key": e.key, "fix": e.fix}
    shutil.rmtree(d, ignore_errors=True)
    return {**r, "scratch": str(d), "lock_entry": entry, "uncached": uncached}


def receive(root: Path, r: dict, project: ProjectConfig) -> None:
    """Bring a block trained in a scratch clone into the project: its files, its dvc.lock entry, the block folder
    from the DVC remote, checked; on any failure the project is put back as it was."""
    key, layout = r["key"], Layout(root)
    files = {}
    for rel in r["uncached"]:
        p = (root / rel).resolve()
        if root.resolve() not in p.parents:  # a lock entry names paths inside the project, nothing else
            raise ZgError(f"block {key} came back with an output outside the project: {rel}", key=f"blocks.{key}")
        files[rel] = p
    lock_path, block = root / "dvc.lock", layout.block_dir(key)
    saved = {p: p.read_bytes() if p.exists() else None for p in [lock_path, *files.values()]}
    aside = layout.state_dir / "receive" / key  # the recorded block, kept until the new one is checked
    shutil.rmtree(aside, ignore_errors=True)
    if block.exists():
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(block, aside)
    try:
        for rel, p in files.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(r["uncached"][rel])
        lock = safe_load(lock_path.read_text()) if lock_path.exists() else None
        lock = lock or {"schema": "2.0", "stages": {}}
        lock.setdefault("stages", {})[f"train@{key}"] = r["lock_entry"]
        write_text(lock_path, yaml.safe_dump(lock, sort_keys=False))  # `dvc commit` rewrites it in DVC's own format
        dvc(root, "pull", f"train@{key}")
        _check_received(root, block, r, project)
    except BaseException:
        shutil.rmtree(block, ignore_errors=True)
        if aside.exists():
            os.replace(aside, block)
        for p, data in saved.items():
            p.unlink(missing_ok=True) if data is None else p.write_bytes(data)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _check_received(root: Path, block: Path, r: dict, project: ProjectConfig) -> None:
    """The pulled block folder (``block``, in ``root``) is the one the worker trained (its files hash to the
    worker's dvc.lock entry, its meta.json holds the state the worker reported) under the driver's params (config
    and seed)."""
    import json

    from zgdata.trust import dvc_lock
    from zgtrain.fit.schedule import block_seed

    key = r["key"]
    fix = (
        "check who else writes the DVC remote (its objects for this block are not the worker's), then rerun `zg repro`"
    )
    try:
        dvc_lock.verify(block)
    except ZgError as e:
        _forget_fetched(root, r["lock_entry"].get("outs") or [])
        raise ZgError(
            f"block {key} pulled from the DVC remote is not the one the worker pushed: {e.what}", fix=fix
        ) from e
    meta = json.loads((block / "meta.json").read_text())
    cfg = project.block(key).train
    want = json.loads(json.dumps(cfg.identity()))  # as meta.json holds it (lists, not tuples)
    if meta.get("state_sha256") != r.get("state_sha256"):
        raise ZgError(f"block {key} pulled from the DVC remote holds another state than the worker reported", fix=fix)
    if meta.get("config") != want or meta.get("seed") != block_seed(project.seed, cfg.seed, key):
        raise ZgError(
            f"block {key} came back trained with other params than this project's (its meta.json's config or seed)",
            key=f"blocks.{key}",
            fix="rerun `zg repro` once no other driver trains this block from the same commit",
        )


def _forget_fetched(root: Path, outs: list[dict]) -> None:
    """After a pull of OUTS failed zg's check, make a retry fetch them again once the remote is put right.

    DVC does not hash what it downloads, so what the remote served stays in ROOT's cache under the names it was
    asked for: each directory's file list (dropped) and every object that list names whose bytes do not hash to
    its name (dropped; an intact object is kept). DVC also remembers the remote's listing in its data index,
    outside the project (keyed by the project's path); with that dropped too, the next `dvc pull` lists the remote
    afresh. Without both, a retry in the same project failed with DVC's "Is your cache up to date?"."""
    import json
    import logging

    from dvc.repo import Repo

    from zgdata.trust import dvc_lock

    for o in outs:
        md5 = str(o.get("md5", ""))
        listing = dvc_lock.cache_object(root, md5)
        names = [md5]
        if md5.endswith(".dir"):
            try:
                names = [str(e["md5"]) for e in json.loads(listing.read_bytes())]
            except (OSError, ValueError, TypeError, KeyError):
                names = []
            listing.unlink(missing_ok=True)
        for name in names:
            obj = dvc_lock.cache_object(root, name)
            if obj.is_file() and dvc_lock.file_md5(obj) != name:
                obj.unlink()
    # DVC logs each tree it no longer finds, with a traceback
    with dvc_logging(logging.CRITICAL), Repo(str(root)) as repo:
        repo.drop_data_index()

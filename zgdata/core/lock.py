"""Project locks: at most one `zg` process writes a stage's outputs at a time.

Two `zg data materialize` at once once published boundaries holding every row twice, and
two `zg train block b00` at once deleted each other's checkpoints. Each stage that writes
shared outputs therefore holds an advisory ``flock`` on ``<root>/.zg/locks/<name>.lock`` for
its whole run (decorate the stage function with ``@locked("<stage>")``); a second process
fails at once with one line naming the holder's pid and command (exit code 75, EX_TEMPFAIL).

A flock belongs to the open file, so the kernel drops it when its process ends, however it
ends (``kill -9`` included): a lock is never stale and there is nothing to delete by hand.
The file only carries the holder's pid and command for that message.

No ``--wait``: the second writer of the same outputs is always redundant (DVC runs a stage
once; a rerun afterwards is a cheap no-op or a resume), so waiting would only hide the
mistake and, behind a stuck run, hang a script forever.

Only writers lock. A stage reading another stage's outputs while that stage rewrites them
(train while materialize runs) is not prevented here.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from zgdata.core.paths_guard import inside, output
from zgdata.errors import ZgError, from_os_error
from zgdata.layout import Layout

__all__ = ["locked", "stage_lock", "project_lock", "lock_path", "remove_dead_staging", "BUSY_EXIT_CODE"]

BUSY_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"


@dataclass(frozen=True)
class _Stage:
    writes: Callable[[Layout, str | None], Path]  # named in the "another process" message
    errors_at: Callable[[Layout, str | None], Path]  # named in OS errors that carry no path (Lance's)
    cleanup: Callable[[Layout, str | None], None] | None = None


def _clean_block(layout: Layout, key: str | None) -> None:
    """What a killed run's atomic writes left (``.ckpt-N.partial/``, ``.model.safetensors.partial``); never resumed from."""
    d = layout.block_dir(str(key))
    if not re.fullmatch(r"[A-Za-z0-9_-]+", str(key)) or not d.is_dir():  # never glob outside models/blocks/
        return
    dead = sorted(d.glob(".*.partial"))  # zgdata.core.atomic.atomic_path's scratch names
    for p in dead:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if dead:
        print(
            f"train {key}: removed what a killed run left half-written: {', '.join(p.name for p in dead)}",
            file=sys.stderr,
        )


_STAGES = {
    "teacher": _Stage(lambda L, k: L.teacher_dir, lambda L, k: L.teacher_dir),
    "sample": _Stage(lambda L, k: L.sample_jsonl, lambda L, k: L.sample_jsonl.parent),
    "tokens": _Stage(lambda L, k: L.tokens, lambda L, k: L.tokens.parent),
    "materialize": _Stage(lambda L, k: L.boundaries_dir, lambda L, k: L.staging),
    "block": _Stage(lambda L, k: L.block_dir(str(k)), lambda L, k: L.block_dir(str(k)), _clean_block),
    "assemble": _Stage(lambda L, k: L.student, lambda L, k: L.student.parent),
    "evaluate": _Stage(lambda L, k: L.eval_metrics, lambda L, k: L.eval_metrics.parent),
}

# (lock file, thread) -> depth: a stage may call another under the same lock in its own thread; another
# thread of this process is refused like another process (its flock on a second open file conflicts)
_held: dict[tuple[str, int], int] = {}


def _held_key(path: Path) -> tuple[str, int]:
    return str(path.resolve()), threading.get_ident()


def lock_path(layout: Layout, name: str) -> Path:
    return layout.locks_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock"


def _show(path: Path) -> str:
    p = os.path.relpath(path) if os.path.isabs(path) else str(path)
    return str(path) if p.startswith("..") else p


def _holder(fd: int) -> dict:
    """The holder's record; it writes it just after taking the lock, so give it a moment."""
    for _ in range(40):
        raw = os.pread(fd, 4096, 0)
        if raw:
            with contextlib.suppress(ValueError):
                return json.loads(raw)
        time.sleep(0.05)
    return {}


def _busy(path: Path, writes: Path, holder: dict) -> ZgError:
    pid = holder.get("pid", "unknown")
    host = holder.get("host")
    where = f" on host {host}" if host and host != socket.gethostname() else ""
    cmd = f": `{holder['cmd']}`" if holder.get("cmd") else ""
    return ZgError(
        f"another zg process (pid {pid}{where}{cmd}) is writing {_show(writes)}",
        fix=f"wait for it to finish (or stop it), then rerun; if pid {pid} is no longer running, just "
        f"rerun: the lock ({_show(path)}) is released with its process, even after kill -9, so "
        f"there is nothing to delete",
        code=BUSY_EXIT_CODE,
    )


@contextlib.contextmanager
def _os_errors_as_zg(path: Path) -> Iterator[None]:
    """Full disk, quota, permission and read-only errors raised inside become one-line ZgErrors."""
    try:
        yield
    except ZgError:
        raise
    except Exception as e:
        err = from_os_error(e, path)
        if err is None:
            raise
        raise err from e


def _guard(layout: Layout, name: str, lock: Path, writes: Path, errors_at: Path | None) -> None:
    """Refuse, before the stage does anything, outputs that resolve outside the project (zgdata/core/paths_guard.py):
    ``writes`` (replaced as a whole), the folder it writes in (``errors_at``) and the lock file, which is opened
    for writing through any link (and .zg/.gitignore beside it)."""
    output(writes, layout.root, what=f"{name}'s output")
    for p in (errors_at, lock, lock.parent.parent / ".gitignore"):
        if p is not None:
            inside(p, layout.root, what=f"{name}'s output")


@contextlib.contextmanager
def project_lock(layout: Layout, name: str, *, writes: Path, errors_at: Path | None = None) -> Iterator[None]:
    """Hold ``.zg/locks/<name>.lock`` (exclusive, non-blocking) while the body writes ``writes``.

    Raises a one-line ZgError naming the holder when another process holds it. OS errors in
    the body (ENOSPC, EDQUOT, EACCES, EPERM, EROFS) become ZgErrors naming ``errors_at``
    when they carry no path of their own.
    """
    path = lock_path(layout, name)
    _guard(layout, name, path, writes, errors_at)
    with _os_errors_as_zg(errors_at or writes):
        key = _held_key(path)
        if key in _held:  # this thread already holds it
            _held[key] += 1
            try:
                yield
            finally:
                _held[key] -= 1
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        ignore = path.parent.parent / ".gitignore"  # projects made before `zg init` listed /.zg/ stay clean too
        if not ignore.exists():
            ignore.write_text("*\n")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(path, writes, _holder(fd)) from None
            cmd = " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "cmd": re.sub(r"\s+", " ", cmd)[:300],
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            with contextlib.suppress(OSError):  # the record is only for the message; a full disk must not stop us here
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(record).encode(), 0)
            _held[key] = 1
            try:
                yield
            finally:
                del _held[key]
                with contextlib.suppress(OSError):  # no stale record for the next failed attempt to show
                    os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # releases the flock


@contextlib.contextmanager
def stage_lock(layout: Layout, stage: str, key: str | None = None) -> Iterator[None]:
    """The lock of ``stage`` (one per block ``key``), then that stage's cleanup of what dead runs left."""
    spec = _STAGES[stage]
    name = f"{stage}-{key}" if key is not None else stage
    with project_lock(layout, name, writes=spec.writes(layout, key), errors_at=spec.errors_at(layout, key)):
        if spec.cleanup is not None:
            spec.cleanup(layout, key)
        yield


def locked(stage: str):
    """Decorator: run the stage function under ``stage_lock``, taking its ``layout`` (and ``key``) arguments."""
    if stage not in _STAGES:
        raise ValueError(f"unknown stage {stage!r}")

    def wrap(fn):
        sig = inspect.signature(fn)
        if "layout" not in sig.parameters or (stage == "block") != ("key" in sig.parameters):
            raise TypeError(
                f"@locked({stage!r}) needs a `layout` parameter" + (" and a `key`" if stage == "block" else "")
            )

        @functools.wraps(fn)
        def run(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            with stage_lock(bound.arguments["layout"], stage, bound.arguments.get("key")):
                return fn(*args, **kwargs)

        return run

    return wrap


def remove_dead_staging(layout: Layout, keep: Path) -> list[Path]:
    """Remove staging dirs of other fingerprints (their inputs changed: nothing will resume them).

    Only safe under the materialize lock, which this checks."""
    if _held_key(lock_path(layout, "materialize")) not in _held:
        raise RuntimeError("remove_dead_staging needs the materialize lock (@locked('materialize'))")
    staging = inside(layout.staging, layout.root, what="output")
    inside(keep, layout.root, what="output")  # reconcile removes and rewrites datasets in it
    dead = sorted(p for p in staging.iterdir() if p.name != keep.name) if staging.is_dir() else []
    for p in dead:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if dead:
        print(
            f"materialize: removed {len(dead)} staging dir(s) of earlier runs whose inputs have changed since "
            f"(they can never resume): {', '.join(_show(p) for p in dead)}",
            file=sys.stderr,
        )
    return dead

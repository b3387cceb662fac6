"""Atomic publishing of files and directories: readers see the old version or the new one, never half of one.

``atomic_path(path)`` yields a scratch path beside ``path``; the caller writes a file or a
directory there, and on a clean exit it replaces ``path`` (a rename on the same filesystem).
On an exception the scratch path is removed and ``path`` is left as it was. A killed
process leaves only a hidden ``.NAME.partial`` sibling, which the next write removes.

Every write here is also where zg's outputs meet the disk, so each one first checks that ``path`` stays
inside its project (zgdata/core/paths_guard.py ``output``): a symlinked output folder pointing elsewhere is
refused with one line before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zgdata.core.paths_guard import output

__all__ = ["atomic_path", "replace_path", "sync_entries", "sync_tree", "write_json", "write_text"]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def replace_path(src: Path, dst: Path) -> None:
    """Move a finished file or directory ``src`` onto ``dst``, replacing what was there.

    A file is replaced in one rename. A directory cannot be renamed over a non-empty one, so
    the old one is first renamed aside: at every moment ``dst`` is absent, old or new, never mixed.
    """
    _swap(Path(src), output(dst))


def _swap(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    old = dst.with_name(f".{dst.name}.old")
    if src.is_dir() and (dst.exists() or dst.is_symlink()):
        if old.exists() or old.is_symlink():
            _remove(old)
        os.replace(dst, old)
        os.replace(src, dst)
        _remove(old)
    else:
        os.replace(src, dst)
        if old.exists() or old.is_symlink():  # a swap killed between its renames left the old one aside
            _remove(old)


def _sync(path: Path) -> None:
    """Flush a file's (or a folder's entries') writes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a file system that cannot sync a folder (some network ones) says so; nothing to flush
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def sync_tree(path: Path) -> None:
    """Flush every file under ``path`` (a file: itself) and every folder's entries, ``path``'s own last: what a
    rename then publishes outlives a power loss, not only a kill."""
    path = Path(path)
    if path.is_dir():
        for folder, _, files in os.walk(path, topdown=False):
            for f in files:
                _sync(Path(folder) / f)
            _sync(Path(folder))
    else:
        _sync(path)


def sync_entries(folder: Path) -> None:
    """Flush a folder's entries (the renames into it), not its files."""
    _sync(Path(folder))


@contextlib.contextmanager
def atomic_path(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a scratch path for ``path``'s new content; publish it on success, drop it on failure.

    ``durable``: what was written there (a file, or a folder's files and the folder) is on the disk before it is
    published, and the publishing rename when this returns: it outlives a power loss, not only a kill."""
    path = output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    if tmp.exists() or tmp.is_symlink():
        _remove(tmp)  # left by a killed run
    try:
        yield tmp
        if durable:
            for f in (*(tmp.iterdir() if tmp.is_dir() else ()), tmp):
                _sync(f)
        _swap(tmp, path)
        if durable:
            _sync(path.parent)
    except BaseException as e:
        if isinstance(e, OSError) and e.filename is None:  # a failed write() does not say which file
            e.filename = str(tmp)
        with contextlib.suppress(OSError):  # e.g. a read-only file system refuses even this
            if tmp.exists() or tmp.is_symlink():
                _remove(tmp)
        raise


def write_text(path: Path, text: str, *, durable: bool = False) -> None:
    """``text`` into ``path``, replaced atomically; ``durable``: on the disk (file and folder entry) on return."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_text(text)


def write_json(path: Path, obj: Any, *, durable: bool = False) -> None:
    """Pretty, key-sorted JSON (deterministic bytes for DVC), replaced atomically (``durable``: ``write_text``)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", durable=durable)

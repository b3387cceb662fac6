"""The teacher's identity on disk: every file in models/teacher/hf is one that `prepare` wrote.

`prepare` records the sha256 of each file's bytes in teacher.json (``files``). Every load
(zgdata.teacher.prepare.load_teacher and load_tokenizer) compares the files on disk with that list:
a changed, missing or extra file is refused, because a swapped model of the same shape would
otherwise change boundaries, online targets and eval verdicts without any error.

Hashing a 0.5 GB checkpoint costs 1-2 s, so each file's digest is cached in
``<root>/.zg/cache/teacher_files.json`` keyed by the file's stat (path, size, mtime_ns, ctime_ns,
inode): a repeat load costs one stat per file. ctime and inode are in the key because tools that
copy a file keep its mtime (cp -p, rsync -a) but can not keep its ctime or inode. ``rehash=True``
(`zg data verify`) ignores the cache and hashes every byte; what it computes refreshes the cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from zgdata.core.hashing import file_sha256
from zgdata.core.paths_guard import inside
from zgdata.errors import ZgError, dvc_checkout
from zgdata.layout import Layout

__all__ = ["FilesCheck", "record_files", "check_files", "cache_path", "RESTORE"]

CACHE_VERSION = 1
# the teacher stage's name restores all its outputs (models/teacher is none)
RESTORE = (
    f"restore it with `{dvc_checkout('teacher')}` (or `dvc pull teacher`: the teacher stage's outputs), "
    "or re-run `dvc repro -f teacher` if the teacher is meant to change"
)


@dataclass(frozen=True, kw_only=True)
class FilesCheck:
    """What one check did: how many files, how many digests were computed vs taken from the cache."""

    files: int
    hashed: int
    cached: int
    rehash: bool

    def as_dict(self) -> dict:
        return {"files": self.files, "hashed": self.hashed, "cached": self.cached, "rehash": self.rehash}


def cache_path(layout: Layout) -> Path:
    return layout.teacher_files_cache


def _on_disk(hf: Path) -> dict[str, Path]:
    """Every non-directory entry under hf/ by its relative POSIX name (symlinked files included)."""
    if not hf.is_dir():
        return {}
    return {p.relative_to(hf).as_posix(): p for p in sorted(hf.rglob("*")) if not p.is_dir()}


def _stat_key(path: Path) -> tuple[str, list[int]]:
    st = os.stat(path)  # follows symlinks: DVC's symlink cache type links each file
    return str(Path(path).resolve()), [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _load_cache(layout: Layout) -> dict:
    """The cache's entries, or {} when it is missing, unreadable or of another version (it is only a cache)."""
    try:
        data = json.loads(cache_path(layout).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


def _save_cache(layout: Layout, entries: dict) -> None:
    """Atomic replace with a per-process temp name (parallel stages may load the teacher at once)."""
    path = inside(cache_path(layout), layout.root, what="output")  # .zg/ linked elsewhere: refused
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "files": entries}, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only project still loads; it only pays the hashing every time


def record_files(layout: Layout) -> dict[str, str]:
    """sha256 of every file in models/teacher/hf (for teacher.json ``files``); seeds the cache."""
    entries, out = {}, {}
    for name, path in _on_disk(layout.teacher_hf).items():
        key, sig = _stat_key(path)
        out[name] = file_sha256(path)
        entries[key] = {"stat": sig, "sha256": out[name]}
    _save_cache(layout, entries)
    return out


def check_files(layout: Layout, teacher: dict, *, rehash: bool = False) -> FilesCheck:
    """Refuse unless models/teacher/hf holds exactly the files teacher.json lists, with their recorded digests."""
    hf = layout.teacher_hf
    files = teacher.get("files")
    if not isinstance(files, dict) or not files:
        raise ZgError(
            f"{layout.teacher_json} has no per-file digests (`files`): it was written by an older zg",
            fix="re-run `dvc repro -f teacher` (or `zg teacher prepare`) to record them",
        )
    disk = _on_disk(hf)
    extra = sorted(set(disk) - set(files))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ZgError(
            f"{hf / extra[0]}{more} is not a file of the prepared teacher (teacher.json does not list it)",
            fix="remove it, or " + RESTORE,
        )
    missing = sorted(set(files) - set(disk))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ZgError(f"{hf / missing[0]}{more} is missing (teacher.json lists it)", fix=RESTORE)
    cache = {} if rehash else _load_cache(layout)
    entries, hashed = {}, 0
    for name in sorted(files):
        key, sig = _stat_key(disk[name])  # stat before reading: a concurrent rewrite then misses next time
        hit = cache.get(key)
        if isinstance(hit, dict) and hit.get("stat") == sig and isinstance(hit.get("sha256"), str):
            digest = hit["sha256"]
        else:
            digest, hashed = file_sha256(disk[name]), hashed + 1
        entries[key] = {"stat": sig, "sha256": digest}
        if digest != files[name]:
            raise ZgError(
                f"{hf / name} does not match teacher.json (sha256 {digest[:12]} on disk, "
                f"{str(files[name])[:12]} recorded)",
                fix=RESTORE,
            )
    if hashed:
        _save_cache(layout, entries)  # only the current files: the cache never grows
    return FilesCheck(files=len(files), hashed=hashed, cached=len(files) - hashed, rehash=rehash)

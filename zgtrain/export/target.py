"""Where an export may land: anywhere the user names on the command line, never over something that is not zg's.

An export replaces its output as a whole (written beside it, then swapped in). So before anything is written,
``check_target`` refuses, in one line, an output that would destroy what the project or the user holds:
- the project root, a folder above it, or a path in ``.git`` or ``.dvc``;
- a path DVC tracks as another stage's output (``dvc.yaml``, ``dvc.lock``) or as a ``dvc add`` output, or a
  folder inside one: the boundaries, the teacher, the blocks, the students;
- a path git tracks;
- anything that already exists and is not a previous export of zg: a folder whose ``export.json`` lists exactly
  the files beside it, or a ``.gguf`` file whose ``<name>.export.json`` records its sha256.
A command-line path may leave the project (``~/models/student.gguf``), because it is the user's intent; a path
from params (``export.out``) stays inside, which ``ExportConfig`` checks when params are read.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from zgdata.core.hashing import file_sha256
from zgdata.errors import ZgError
from zgdata.trust.dvc_added import holding
from zgdata.trust.dvc_lock import recorded
from zgdata.yamlio import safe_load

__all__ = ["RECORD", "record_path", "is_export", "check_target", "EXPORT_STAGE"]

RECORD = "export.json"
EXPORT_STAGE = "export"
_FIX = "name a new path for --out (or a previous export of zg, which is replaced): zg never writes over other data"


def record_path(out: Path) -> Path:
    """Where an export's lineage record lives: inside its folder, or beside a single ``.gguf`` file."""
    return out.with_name(out.name + ".export.json") if out.suffix == ".gguf" else out / RECORD


def _record(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("files"), dict) and "student_sha256" in doc
    return doc if ok else None


def is_export(out: Path) -> bool:
    """Is OUT a previous export of zg? A folder: its record lists exactly the files beside it (plus the record and
    the card). A file: its sidecar record names it with its sha256."""
    if out.is_symlink():
        return False
    rec = _record(record_path(out))
    if rec is None:
        return False
    if out.is_file():
        return out.suffix == ".gguf" and rec["files"] == {out.name: file_sha256(out)}
    if not out.is_dir():
        return False
    here, want = {p.name for p in out.iterdir()}, {*rec["files"], RECORD}
    plain = all((out / n).is_file() and not (out / n).is_symlink() for n in here)
    return plain and want <= here <= want | {"README.md"}  # the card is optional


def _dvc_outputs(root: Path) -> list[tuple[str, str]]:
    """(path relative to root, who tracks it) for every output DVC tracks in ROOT's pipeline, the export stage's own
    excepted; a templated out (``models/blocks/${key}``) counts as the folder before its first ``${``."""
    out = []
    try:
        spec = safe_load((root / "dvc.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        spec = {}
    exported = set()
    for name, stage in (spec.get("stages") or {}).items():
        body = (stage or {}).get("do", stage) or {}
        for o in body.get("outs") or []:
            path = next(iter(o)) if isinstance(o, dict) else str(o)
            if name == EXPORT_STAGE:
                exported.add(os.path.normpath(path))
                continue
            if "${" in path:
                path = path.split("${", 1)[0].rpartition("/")[0]
            if path:
                out.append((os.path.normpath(path), f"dvc.yaml (stage {name})"))
    out += [(p, "dvc.lock") for p in recorded(root) if p not in exported]
    return out


def _git_tracks(root: Path, out: Path) -> bool:
    try:
        res = subprocess.run(
            ["git", "ls-files", "-z", "--", str(out)], cwd=root, capture_output=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and bool(res.stdout.strip(b"\0"))


def check_target(out: Path, root: Path) -> Path:
    """OUT made absolute (``~`` expanded) when an export may write it; a one-line ZgError otherwise. ROOT: the
    project the export runs in."""
    out = Path(os.path.abspath(Path(out).expanduser()))
    real, base = out.resolve(), Path(root).resolve()
    if real == base or real in base.parents:
        raise ZgError(f"--out {out} is the project folder or a folder above it", fix=_FIX)
    if base in real.parents:
        rel = real.relative_to(base)
        if rel.parts[0] in (".git", ".dvc"):
            raise ZgError(f"--out {out} is inside {rel.parts[0]}/ (git's and DVC's own files)", fix=_FIX)
        for path, by in _dvc_outputs(base):
            tracked = base / path
            how = "is" if real == tracked else "is inside" if tracked in real.parents else "holds"
            if how != "holds" or real in tracked.parents:
                raise ZgError(f"--out {out} {how} DVC-tracked data ({path}, in {by})", fix=_FIX)
        rec = holding(base, real, {})
        if rec is not None:
            raise ZgError(f"--out {out} is DVC-tracked data ({rec.by})", fix=_FIX)
        if _git_tracks(base, real):
            raise ZgError(f"--out {out} holds files git tracks", fix=_FIX)
    if (out.exists() or out.is_symlink()) and not is_export(out):
        what = "folder" if out.is_dir() else "file"
        raise ZgError(f"--out {out} is a {what} that is not a previous export of zg (no {RECORD} lists it)", fix=_FIX)
    side = record_path(out)
    if out.suffix == ".gguf" and (side.exists() or side.is_symlink()) and not _sidecar_of(side, out):
        raise ZgError(
            f"{side}, where the export of --out {out} writes its record, is a "
            f"{'folder' if side.is_dir() else 'file'} that is not zg's record of that export",
            fix=_FIX,
        )
    return out


def _sidecar_of(side: Path, out: Path) -> bool:
    """Is SIDE zg's record of a single-file export OUT (the file itself may be gone: a record left behind)?"""
    rec = None if side.is_symlink() or not side.is_file() else _record(side)
    return rec is not None and list(rec["files"]) == [out.name]

"""Atomic small-file writes: write beside the target, then rename, so readers never see half a file."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json", "write_text"]


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically; on failure (a full disk) the old file stays and no temp file is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException as e:
        if isinstance(e, OSError) and e.filename is None:  # a failed write() does not say which file
            e.filename = str(tmp)
        with contextlib.suppress(OSError):  # e.g. a read-only file system refuses even this
            tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    """Pretty, key-sorted JSON (deterministic bytes for DVC), replaced atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

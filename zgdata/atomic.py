"""Atomic small-file writes: write beside the target, then rename, so readers never see half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json"]


def write_json(path: Path, obj: Any) -> None:
    """Pretty, key-sorted JSON (deterministic bytes for DVC), replaced atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)

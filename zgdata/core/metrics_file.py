"""Metrics files that DVC tracks hold the figures a rerun reproduces, never wall-clock ones.

A stage's metrics (metrics/eval.json, metrics/blocks/KEY.json, ...) are DVC outputs whose md5 dvc.lock records. A
wall-clock figure in them (``seconds``, ``tokens_per_s``) would give every rerun of the same work, and
`zg repro --jobs N` against a serial `dvc repro`, another hash for the same result, and a no-op rerun would rewrite
the file. ``write_metrics`` writes the file without them, and only when its content changed, so a no-op rerun
writes nothing; the timings go to ``.zg/timings/<the metrics file's path>`` under the project root (untracked by
git and DVC), where the commands and the benchmarks read them (``read_timings``). The result a command prints
(``--json``) keeps them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zgdata.core.atomic import write_json
from zgdata.core.paths_guard import project_root

__all__ = ["TIMED_KEYS", "split_timed", "timings_path", "write_metrics", "read_timings"]

TIMED_KEYS = frozenset({"seconds", "tokens_per_s"})


def split_timed(obj: Any) -> tuple[Any, dict]:
    """(OBJ without any TIMED_KEYS entry at any depth of its mappings, those entries in the same nesting)."""
    if not isinstance(obj, dict):
        return obj, {}
    kept, timed = {}, {}
    for k, v in obj.items():
        if k in TIMED_KEYS:
            timed[k] = v
            continue
        kept[k], inner = split_timed(v)
        if inner:
            timed[k] = inner
    return kept, timed


def timings_path(path: Path | str) -> Path | None:
    """Where the timings of metrics file PATH live: ``.zg/timings/`` plus its path in the project (None outside
    a project)."""
    path = Path(path).absolute()
    root = project_root(path)
    return None if root is None else root / ".zg" / "timings" / path.relative_to(root)


def _read(path: Path | None) -> dict | None:
    try:
        return json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def write_metrics(path: Path | str, metrics: dict) -> None:
    """Write METRICS to PATH without its wall-clock figures (skipped when PATH holds exactly that already), and the
    figures to ``timings_path(PATH)``."""
    kept, timed = split_timed(metrics)
    if _read(Path(path)) != json.loads(json.dumps(kept, default=str)):
        write_json(Path(path), kept)
    where = timings_path(path)
    if timed and where is not None:
        write_json(where, timed)


def read_timings(path: Path | str) -> dict:
    """The timings the last ``write_metrics`` of PATH set aside ({} when none)."""
    return _read(timings_path(path)) or {}

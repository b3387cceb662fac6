"""Rich progress on stderr (stdout is kept for results)."""

from __future__ import annotations

import contextlib
import os

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

__all__ = ["stderr", "progress"]

stderr = Console(stderr=True)


@contextlib.contextmanager
def progress(description: str, total: int, *, unit: str = "tok", completed: int = 0):
    """Yield ``advance(n)``; shows rate in ``unit``/s and the ETA. Silent when ZG_QUIET=1."""
    if os.environ.get("ZG_QUIET") == "1":
        yield lambda n=1: None
        return
    cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    with Progress(*cols, console=stderr, transient=False) as bar:
        task = bar.add_task(description, total=total, completed=completed, rate="")

        def advance(n: int = 1) -> None:
            bar.advance(task, n)
            speed = bar.tasks[0].speed
            if speed:
                bar.update(task, rate=f"{speed:,.0f} {unit}/s")

        yield advance

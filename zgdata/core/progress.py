"""Progress on stderr (stdout is kept for results).

A live Rich bar on a terminal; on a pipe or log file (CI, `dvc repro > log`), a plain
line every ~10% or 30 s instead, so long runs still show rate and ETA.
"""

from __future__ import annotations

import contextlib
import os
import time

from rich.console import Console

__all__ = ["stderr", "progress"]

stderr = Console(stderr=True)


def _rate(r: float) -> str:
    return f"{r:,.0f}" if r >= 100 else f"{r:.3g}"


@contextlib.contextmanager
def _plain(description: str, total: int, unit: str, completed: int):
    t0, done, last = time.perf_counter(), completed, [time.perf_counter(), completed]

    def advance(n: int = 1) -> None:
        nonlocal done
        done += n
        now = time.perf_counter()
        if done >= total or now - last[0] > 30 or (done - last[1]) >= total / 10:
            rate = (done - completed) / max(now - t0, 1e-9)
            eta = (total - done) / rate if rate else float("nan")
            stderr.print(
                f"{description}: {done:,}/{total:,} {unit} ({100 * done / max(total, 1):.0f}%), "
                f"{_rate(rate)} {unit}/s, ETA {eta:,.0f}s",
                highlight=False,
            )
            last[:] = [now, done]

    yield advance


@contextlib.contextmanager
def progress(description: str, total: int, *, unit: str = "tok", completed: int = 0):
    """Yield ``advance(n)``; shows rate in ``unit``/s and the ETA. Silent when ZG_QUIET=1."""
    if os.environ.get("ZG_QUIET") == "1":
        yield lambda n=1: None
        return
    if not stderr.is_terminal:
        with _plain(description, total, unit, completed) as advance:
            yield advance
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,  # a live bar only: not on every import
        TimeRemainingColumn,
    )

    cols = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, console=stderr, transient=False) as bar:
        task = bar.add_task(description, total=total, completed=completed, rate="")

        def advance(n: int = 1) -> None:
            bar.advance(task, n)
            speed = bar.tasks[0].speed
            if speed:
                bar.update(task, rate=f"{_rate(speed)} {unit}/s")

        yield advance

"""zgdata/core/progress.py off a terminal (a pipe, CI, `dvc repro > log`): a plain line every 10% of the total,
every 30 s and at the end, with the rate of this run's work and the ETA; nothing under ZG_QUIET=1.

The suite sets ZG_QUIET=1 (tests/conftest.py), so no other test sees these lines. The module's console is
replaced by one writing to a buffer that is not a terminal, and its clock (``time.perf_counter``) by one the test
moves."""

from __future__ import annotations

import io
import types

import pytest
from rich.console import Console

from zgdata.core import progress as progress_mod


@pytest.fixture
def out(monkeypatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(progress_mod, "stderr", Console(file=buf, force_terminal=False, width=200))
    monkeypatch.delenv("ZG_QUIET", raising=False)
    return buf


@pytest.fixture
def clock(monkeypatch, out):
    now = [0.0]
    monkeypatch.setattr(progress_mod, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def _lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.strip()]


def test_plain_lines_every_tenth_every_30_s_and_at_the_end(clock, out):
    with progress_mod.progress("materialize", 1000) as advance:
        clock[0] = 1.0
        advance(100)  # a tenth of the total since the last line
        clock[0] = 2.0
        advance(50)  # neither a tenth nor 30 s: silent
        clock[0] = 40.0
        advance(0)  # 39 s since the last line
        clock[0] = 45.0
        advance(1)  # 45 s since the start but 5 s since the last line: silent
        clock[0] = 46.0
        advance(849)  # the end
    assert _lines(out) == [
        "materialize: 100/1,000 tok (10%), 100 tok/s, ETA 9s",
        "materialize: 150/1,000 tok (15%), 3.75 tok/s, ETA 227s",
        "materialize: 1,000/1,000 tok (100%), 21.7 tok/s, ETA 0s",
    ]


def test_the_last_line_comes_even_under_a_tenth_since_the_one_before(clock, out):
    with progress_mod.progress("rows", 100, unit="row") as advance:
        clock[0] = 1.0
        advance(95)
        clock[0] = 2.0
        advance(5)  # under a tenth and 1 s since the last line, but the end
    assert _lines(out) == ["rows: 95/100 row (95%), 95 row/s, ETA 0s", "rows: 100/100 row (100%), 50 row/s, ETA 0s"]


def test_a_resumed_run_counts_only_its_own_work_in_the_rate(clock, out):
    with progress_mod.progress("train b00", 1000, unit="step", completed=500) as advance:
        clock[0] = 2.0
        advance(100)
    assert _lines(out) == ["train b00: 600/1,000 step (60%), 50 step/s, ETA 8s"]


def test_quiet_prints_nothing(clock, out, monkeypatch):
    monkeypatch.setenv("ZG_QUIET", "1")
    with progress_mod.progress("materialize", 10) as advance:
        clock[0] = 1.0
        advance(10)
    assert _lines(out) == []

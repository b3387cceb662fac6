"""A small timing hook: product code marks stages with ``span``, a benchmark ``collect``s them.

    with span("materialize.capture", rows=len(rows)):      # in product code
        caps = capture(...)

    with collect() as t:                                   # in a benchmark or a test
        materialize(...)
    t["materialize.capture"].seconds, t["materialize.capture"].count

Without an active collector a span only checks one module global and returns, so the
marks cost nothing that matters in normal runs. With one, each span adds its wall time,
a count of one and its optional ``rows`` / ``nbytes`` to a per-name ``Stat``.

Collectors are process-wide, not per-thread, on purpose: materialize commits in a
background writer thread and the loader reads in a prefetch thread, and those spans must
be counted too. ``Timings.add`` takes a lock, so spans may close in any thread. Collectors
may nest; every active one receives every span (the set active when the span opened).

The only global state is ``_active``, the tuple of active collectors; ``collect`` adds its
``Timings`` on entry and removes it on exit. Enter and leave ``collect`` on one thread (the
benchmark's); spans may run anywhere. Spans nest freely: an outer span includes its inner ones.

Spans in the product code: materialize.{load_teacher, read_tokens, capture, to_host (the wait for a GPU's copies
to the host, zgdata/core/host_copy.py), commit (writer thread; rows and bytes written), finalize}; reader.take (one per boundary read, with bytes);
train.steps (the optimizer-step loop of one train_block call).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["span", "collect", "Timings", "Stat"]

_active: tuple[Timings, ...] = ()  # the active collectors; () = timing off


@dataclass
class Stat:
    """Totals of one span name. ``first_start``/``last_end`` are ``time.perf_counter()`` values."""

    count: int = 0
    seconds: float = 0.0
    rows: int = 0
    nbytes: int = 0
    first_start: float = float("inf")
    last_end: float = float("-inf")
    samples: list[float] = field(default_factory=list)  # each span's seconds, when the collector keeps them


class Timings:
    """Totals per span name; thread-safe. ``samples=True`` also keeps every span's duration."""

    def __init__(self, *, samples: bool = False):
        self.keep_samples = samples
        self._lock = threading.Lock()
        self._stats: dict[str, Stat] = {}

    def add(self, name: str, start: float, end: float, *, rows: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            s = self._stats.setdefault(name, Stat())
            s.count += 1
            s.seconds += end - start
            s.rows += rows
            s.nbytes += nbytes
            s.first_start = min(s.first_start, start)
            s.last_end = max(s.last_end, end)
            if self.keep_samples:
                s.samples.append(end - start)

    def __getitem__(self, name: str) -> Stat:
        """A copy of the totals of ``name``; an empty ``Stat`` if no such span closed."""
        with self._lock:
            s = self._stats.get(name, Stat())
            return Stat(s.count, s.seconds, s.rows, s.nbytes, s.first_start, s.last_end, list(s.samples))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._stats)


class span:
    """Time the block under ``name`` for every active collector; set ``.rows`` / ``.nbytes`` inside if known late."""

    __slots__ = ("name", "rows", "nbytes", "_to", "_t")

    def __init__(self, name: str, *, rows: int = 0, nbytes: int = 0):
        self.name, self.rows, self.nbytes = name, rows, nbytes

    def __enter__(self) -> span:
        self._to = _active
        if self._to:
            self._t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        if self._to:  # counted even if the block raised: that time was spent too
            end = time.perf_counter()
            for t in self._to:
                t.add(self.name, self._t, end, rows=int(self.rows), nbytes=int(self.nbytes))
        return False


@contextmanager
def collect(*, samples: bool = False) -> Iterator[Timings]:
    """Activate a new ``Timings`` for the block (in addition to any already active) and yield it."""
    global _active
    t = Timings(samples=samples)
    _active = _active + (t,)
    try:
        yield t
    finally:  # remove this one only: correct even if collectors are not left in LIFO order
        _active = tuple(x for x in _active if x is not t)

"""What `zg repro` shows while blocks train: one row per running block (step, loss, ETA, where), then a summary.

Updates arrive as small dicts (``{"key", "step", "steps", "loss", "host", "pid", "node"?}``) from the
in-process trainer or, through Ray, from the workers. On a terminal a live table redraws; in logs a plain
line per running block every 15 s. ``ZG_QUIET=1`` silences the live view (the summary still prints).
"""

from __future__ import annotations

import os
import time

from zgdata.core.progress import stderr

__all__ = ["Monitor", "summary_lines", "where"]


def where(r: dict) -> str:
    if r.get("pid") is None:
        return "worker lost"
    return f"{r.get('node') or r.get('host')} pid {r['pid']}"


def _eta(row: dict) -> str:
    if row["step"] is None or row["rate"] is None or row["rate"] <= 0:
        return "?"
    return f"{(row['steps'] - row['step']) / row['rate']:.0f}s"


class Monitor:
    def __init__(self, every: float | None = None):
        self.rows: dict[str, dict] = {}
        self.quiet = os.environ.get("ZG_QUIET") == "1"
        self.live = None
        self.every = every if every is not None else 15.0
        self.last = 0.0

    def __enter__(self) -> Monitor:
        if not self.quiet and stderr.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=stderr, refresh_per_second=2, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, u: dict) -> None:
        now = time.monotonic()
        row = self.rows.get(u["key"])
        if row is None or row.get("pid") != u.get("pid"):  # a new block, or a retry in another worker
            row = self.rows[u["key"]] = {"t": now, "s": u.get("step"), "rate": None}
        if row["s"] is None:
            row.update(t=now, s=u.get("step"))
        elif u.get("step") is not None and u["step"] > row["s"] and now > row["t"]:
            row["rate"] = (u["step"] - row["s"]) / (now - row["t"])
        row.update({k: u.get(k) for k in ("key", "step", "steps", "loss", "host", "pid", "node")})
        self.tick()

    def finished(self, r: dict) -> None:
        self.rows.pop(r.get("key"), None)
        if not self.quiet and self.live is None:
            status = r.get("status")
            stderr.print(
                f"train@{r.get('key')}: {status}" + (f" ({where(r)})" if r.get("pid") else ""), highlight=False
            )
        self.tick(force=True)

    def lines(self) -> list[str]:
        out = []
        for k, r in sorted(self.rows.items()):
            step = "starting" if r["step"] is None else f"step {r['step']}/{r['steps']}"
            loss = "" if r["loss"] is None else f", loss {r['loss']:.4g}"
            out.append(f"train@{k}: {step}{loss}, ETA {_eta(r)} ({where(r)})")
        return out

    def _table(self):
        from rich.table import Table

        t = Table("block", "step", "loss", "ETA", "where", box=None)
        for k, r in sorted(self.rows.items()):
            t.add_row(
                f"train@{k}",
                "starting" if r["step"] is None else f"{r['step']}/{r['steps']}",
                "" if r["loss"] is None else f"{r['loss']:.4g}",
                _eta(r),
                where(r),
            )
        return t

    def tick(self, force: bool = False) -> None:
        if self.quiet:
            return
        if self.live is not None:
            self.live.update(self._table())
            return
        now = time.monotonic()
        if self.rows and (force or now - self.last >= self.every):
            self.last = now
            for line in self.lines():
                stderr.print(line, highlight=False)


def summary_lines(results: dict[str, dict], cluster: dict | None) -> list[str]:
    """Which blocks ran where, how long, with how many threads, and how each ended."""
    if not results:
        return []
    head = (
        f"zg repro: {len(results)} block(s) on Ray at {cluster['address']} ({cluster['nodes']} node(s))"
        if cluster
        else f"zg repro: {len(results)} block(s) in this process"
    )
    out = [head]
    for k, r in sorted(results.items()):
        if r.get("status") == "done":
            detail = (
                f"done, state {str(r.get('state_sha256'))[:12]}, {r.get('seconds', 0):.1f} s, "
                f"{r.get('threads')} thread(s), peak RSS {r.get('peak_rss_mb', 0):.0f} MB"
            )
        else:
            detail = f"FAILED: {r.get('error', '?')}"
        out.append(f"  train@{k}: {detail} [{where(r)}]")
    return out

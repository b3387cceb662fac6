"""zgtrain/exec/progress_view.py: the ETA of a running block and the summary after a run (pure, fast)."""

from __future__ import annotations

from zgtrain.exec.progress_view import _eta, summary_lines


def test_eta_is_the_remaining_steps_over_the_rate():
    """At step 10 of 110 with 2 steps a second, 100 steps remain: 100 / 2 = 50 seconds. Without a rate (no two
    updates yet) or before the first step, the ETA is unknown."""
    assert _eta({"step": 10, "steps": 110, "rate": 2.0}) == "50s"
    assert _eta({"step": 0, "steps": 30, "rate": 0.5}) == "60s"
    assert _eta({"step": 10, "steps": 110, "rate": None}) == "?"
    assert _eta({"step": None, "steps": 110, "rate": 2.0}) == "?"


def test_summary_of_one_done_block_in_this_process():
    """One finished block, no Ray cluster: a head line counting one block in this process, then the block's line
    with its status, the state hash's first 12 characters, seconds, threads, peak RSS and where it ran."""
    results = {
        "b00": {
            "status": "done",
            "state_sha256": "0123456789abcdef" * 4,
            "seconds": 3.25,
            "threads": 2,
            "peak_rss_mb": 512.4,
            "host": "box",
            "pid": 42,
        }
    }
    assert summary_lines(results, None) == [
        "zg repro: 1 block(s) in this process",
        "  train@b00: done, state 0123456789ab, 3.2 s, 2 thread(s), peak RSS 512 MB [box pid 42]",
    ]
    assert summary_lines({}, None) == []

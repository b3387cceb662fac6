"""Test failpoints: the one place product code reads them.

A test that kills a process mid-run (``kill -9`` resume, a killed sharded commit) needs the process to
pause at a known point so the kill lands there. The test sets an environment variable on the child
process (the only channel a separate process has); product code calls ``pause(NAME)`` at the point and
never reads the environment itself. Unset, every failpoint is a no-op costing one dict look-up.

    ZG_FAILPOINT_SLEEP_AFTER_STEP    seconds to sleep after each optimizer step (every training loop)
    ZG_FAILPOINT_HOLD_AFTER_STEP     a file: after each optimizer step, wait while it exists (the test deletes it
                                     to let the run go on: a pause that ends on the test's signal, not a clock's)
    ZG_FAILPOINT_SLEEP_IN_SHARD      seconds a materialize shard task sleeps after each fragment
    ZG_FAILPOINT_SLEEP_AFTER_COMMIT  seconds the sharded driver sleeps after committing a shard
    ZG_FAILPOINT_SLEEP_MID_COMMIT    seconds the sharded driver sleeps between a shard's boundaries
    ZG_FAILPOINT_SLEEP_AFTER_PUBLISH seconds materialize sleeps after renaming each finished boundary into place
    ZG_FAILPOINT_SLEEP_AFTER_SAMPLE  seconds the sample stage sleeps after writing each batch
    ZG_TEST_SHARD_LOG                a file each shard task appends its (pid, node, rows) to
"""

from __future__ import annotations

import os
import time

__all__ = [
    "AFTER_STEP",
    "HOLD_AFTER_STEP",
    "IN_SHARD",
    "AFTER_COMMIT",
    "MID_COMMIT",
    "AFTER_PUBLISH",
    "SHARD_LOG",
    "AFTER_SAMPLE_BATCH",
    "seconds",
    "pause",
    "hold",
    "path",
]

AFTER_STEP = "ZG_FAILPOINT_SLEEP_AFTER_STEP"
HOLD_AFTER_STEP = "ZG_FAILPOINT_HOLD_AFTER_STEP"
IN_SHARD = "ZG_FAILPOINT_SLEEP_IN_SHARD"
AFTER_COMMIT = "ZG_FAILPOINT_SLEEP_AFTER_COMMIT"
MID_COMMIT = "ZG_FAILPOINT_SLEEP_MID_COMMIT"
AFTER_PUBLISH = "ZG_FAILPOINT_SLEEP_AFTER_PUBLISH"
SHARD_LOG = "ZG_TEST_SHARD_LOG"
AFTER_SAMPLE_BATCH = "ZG_FAILPOINT_SLEEP_AFTER_SAMPLE"


def seconds(name: str) -> float:
    """The pause a test asked for at failpoint ``name`` (0.0 when none)."""
    return float(os.environ.get(name, "0") or 0)


def pause(name: str) -> None:
    """Sleep as long as failpoint ``name`` asks (no-op when unset)."""
    s = seconds(name)
    if s:
        time.sleep(s)


def hold(name: str) -> None:
    """Wait while the file that failpoint ``name`` names exists (no-op when unset)."""
    gate = path(name)
    while gate and os.path.exists(gate):
        time.sleep(0.02)


def path(name: str) -> str | None:
    """The file a failpoint names: a log to append to, or a hold's gate (None when unset)."""
    return os.environ.get(name) or None

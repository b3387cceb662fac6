"""Data-parallel materialize (``materialize.workers`` > 1): shards of rows on Ray, committed in row order.

The rows still to do are cut into contiguous shards (``plan``): each starts at a multiple of
``batch_size`` past the resume point, so every teacher batch is the batch a single-process run
captures, and each holds at most ``rows_per_file`` rows and at most rows / workers. Each shard
is a task (zgdata/materialize/shard_task.py, run by zgdata/materialize/ray_shards.py) that writes one Lance data file per
boundary into the staged dataset and returns the fragments' metadata and exact stats.

This driver commits a shard only when every shard before it is committed (``staging.commit``):
one Lance version per boundary per shard (``Overwrite`` creates the dataset, ``Append`` adds to
it), then the journal records the versions, the stats and ``rows_done``, exactly as the
single-process writer does. So the journal's rows_done is always a committed prefix of the rows;
a killed driver's rerun rolls back a half-committed shard (``staging.reconcile``) and plans only the rest.
Files that no commit references (a killed worker's attempt, a finished shard the dead driver
never committed) are deleted before the datasets are published.
"""

from __future__ import annotations

import os
from pathlib import Path

from zgdata.core import failpoints
from zgdata.core.runtime import device
from zgdata.core.timing import span
from zgdata.materialize import ray_shards as shards
from zgdata.materialize.shard_task import VERSIONS
from zgdata.materialize.staging import commit

__all__ = ["run_sharded", "plan"]


def plan(start: int, n_rows: int, *, batch_size: int, rows_per_file: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) shards covering rows start..n_rows, each a whole number of batches (but the last)."""
    left = n_rows - start
    if left <= 0:
        return []
    per = min(rows_per_file, -(-left // workers))
    per = -(-per // batch_size) * batch_size
    return [(lo, min(lo + per, n_rows)) for lo in range(start, n_rows, per)]


def run_sharded(
    cfg,
    *,
    layout,
    stage: Path,
    names: list[str],
    layers: list[int],
    schemas: dict,
    journal,
    n_rows: int,
    seq_len: int,
    hidden: int,
    checksum: str,
    expect: dict,
    advance,
) -> list[dict]:
    """Capture the rows after the journal's ``rows_done`` on Ray and commit them; returns where each shard ran."""
    dev = device()  # refuses a bad ZG_DEVICE here, before any task starts
    gpus = 1 if dev.type == "cuda" else 0
    todo = plan(
        journal.state["rows_done"],
        n_rows,
        batch_size=cfg.batch_size,
        rows_per_file=cfg.rows_per_file,
        workers=cfg.workers,
    )
    base = _base_spec(cfg, layout, stage, names, layers, seq_len, hidden, checksum, expect, dev, gpus)
    specs = [{**base, "lo": lo, "hi": hi} for lo, hi in todo]
    ran = []
    if specs:  # none when every row was committed before a kill: only finalization is left
        with shards.cluster(cpus=cfg.workers * cfg.worker_threads):
            for res in shards.run_ordered(specs, workers=cfg.workers, cpus=cfg.worker_threads, gpus=gpus):
                with span("materialize.commit", rows=res["hi"] - res["lo"]):
                    commit(stage, names, schemas, journal, res, n_rows)
                advance((res["hi"] - res["lo"]) * seq_len)
                ran.append(
                    {k: res[k] for k in ("lo", "hi", "host", "pid", "threads", "seconds", "cpu_seconds", "peak_rss_mb")}
                )
    return ran  # materialize removes orphaned files before finalizing


def _base_spec(
    cfg, layout, stage: Path, names, layers, seq_len: int, hidden: int, checksum: str, expect: dict, dev, gpus
):
    """What every shard task of this run is told (JSON): the rows' shape, the codec and checksum, the versions, the
    device, the test hooks; run_sharded adds each shard's rows."""
    return {
        "root": str(Path(layout.root).resolve()),
        "stage": str(stage.resolve()),
        "names": names,
        "layers": layers,
        "batch_size": cfg.batch_size,
        "seq_len": seq_len,
        "hidden": hidden,
        "storage_dtype": cfg.storage_dtype,
        "codec": cfg.codec,
        "checksum": checksum,
        # a shard's encoding threads: materialize.writer_threads when set; else 1, beside its worker_threads
        "writer_threads": cfg.writer_threads or 1,
        "write_behind_mb": cfg.write_behind_mb,
        "compute_dtype": cfg.compute_dtype,
        "threads": cfg.worker_threads,
        "versions": VERSIONS,
        "expect": expect,
        "device": "cuda" if gpus else str(dev),
        "hooks": {
            "log": failpoints.path(failpoints.SHARD_LOG),
            "driver": os.getpid(),
            "sleep": failpoints.seconds(failpoints.IN_SHARD),
        },
    }

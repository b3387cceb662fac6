"""Data-parallel materialize (``materialize.workers`` > 1): shards of rows on Ray, committed in row order.

The rows still to do are cut into contiguous shards (``plan``): each starts at a multiple of
``batch_size`` past the resume point, so every teacher batch is the batch a single-process run
captures, and each holds at most ``rows_per_file`` rows and at most rows / workers. Each shard
is a task (zgdata/materialize/shard_task.py, run by zgdata/materialize/ray_shards.py) that writes one Lance data file per
boundary into the staged dataset and returns the fragments' metadata and exact stats.

This driver commits a shard only when every shard before it is committed: one Lance version
per boundary per shard (``Overwrite`` creates the dataset, ``Append`` adds to it), then the
journal records the versions, the stats and ``rows_done``, exactly as the single-process
writer does. So the journal's rows_done is always a committed prefix of the rows; a killed
driver's rerun rolls back a half-committed shard (``_reconcile``) and plans only the rest.
Files that no commit references (a killed worker's attempt, a finished shard the dead driver
never committed) are deleted before the datasets are published.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from zgdata.materialize import stats as boundary_stats
from zgdata.timing import span

__all__ = ["run_sharded", "plan"]


def plan(start: int, n_rows: int, *, batch_size: int, rows_per_file: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) shards covering rows start..n_rows, each a whole number of batches (but the last)."""
    left = n_rows - start
    if left <= 0:
        return []
    per = min(rows_per_file, -(-left // workers))
    per = -(-per // batch_size) * batch_size
    return [(lo, min(lo + per, n_rows)) for lo in range(start, n_rows, per)]


def run_sharded(cfg, *, layout, stage: Path, names: list[str], layers: list[int], schemas: dict, journal,
                n_rows: int, seq_len: int, hidden: int, expect: dict, advance) -> list[dict]:
    """Capture the rows after the journal's ``rows_done`` on Ray and commit them; returns where each shard ran."""
    from zgdata.materialize import ray_shards as shards
    from zgdata.runtime import device
    from zgdata.materialize.shard_task import VERSIONS

    dev = device()  # refuses a bad ZG_DEVICE here, before any task starts
    gpus = 1 if dev.type == "cuda" else 0
    todo = plan(journal.state["rows_done"], n_rows, batch_size=cfg.batch_size, rows_per_file=cfg.rows_per_file,
                workers=cfg.workers)
    base = {"root": str(Path(layout.root).resolve()), "stage": str(stage.resolve()), "names": names,
            "layers": layers, "batch_size": cfg.batch_size, "seq_len": seq_len, "hidden": hidden,
            "storage_dtype": cfg.storage_dtype, "codec": cfg.codec, "compute_dtype": cfg.compute_dtype, "threads": cfg.worker_threads,
            "versions": VERSIONS, "expect": expect, "device": "cuda" if gpus else str(dev),
            "hooks": {"log": os.environ.get("ZG_TEST_SHARD_LOG"), "driver": os.getpid(),
                      "sleep": float(os.environ.get("ZG_FAILPOINT_SLEEP_IN_SHARD", "0"))}}
    specs = [{**base, "lo": lo, "hi": hi} for lo, hi in todo]
    ran = []
    if specs:  # none when every row was committed before a kill: only finalization is left
        with shards.cluster(cpus=cfg.workers * cfg.worker_threads):
            for res in shards.run_ordered(specs, workers=cfg.workers, cpus=cfg.worker_threads, gpus=gpus):
                with span("materialize.commit", rows=res["hi"] - res["lo"]):
                    _commit(stage, names, schemas, journal, res, n_rows)
                advance((res["hi"] - res["lo"]) * seq_len)
                ran.append({k: res[k] for k in ("lo", "hi", "host", "pid", "threads", "seconds", "cpu_seconds",
                                                  "peak_rss_mb")})
    return ran  # materialize removes orphaned files before finalizing


def _commit(stage: Path, names: list[str], schemas: dict, journal, res: dict, n_rows: int) -> None:
    """Commit one shard's fragments to every boundary (one Lance version each), then journal it."""
    import lance
    from lance.fragment import FragmentMetadata

    st = journal.state
    lo, hi = res["lo"], res["hi"]
    if lo != st["rows_done"]:  # run_ordered yields in row order; anything else is a bug, never a silent gap
        raise RuntimeError(f"shard {lo}-{hi} committed after row {st['rows_done']}")
    # test hooks that widen a kill window, as in the single-process writer
    sleep = float(os.environ.get("ZG_FAILPOINT_SLEEP_AFTER_COMMIT", "0"))
    sleep_mid = float(os.environ.get("ZG_FAILPOINT_SLEEP_MID_COMMIT", "0"))
    for n in names:
        frags = [FragmentMetadata.from_json(json.dumps(f)) for f in res["fragments"][n]]
        path = str(stage / f"{n}.lance")
        # after a rollback (_reconcile) the latest version restores the journaled one under a new number
        have = lance.dataset(path).version if st["versions"].get(n) else None
        op = lance.LanceOperation.Append(frags) if have else lance.LanceOperation.Overwrite(schemas[n], frags)
        tx = lance.Transaction(read_version=have or 0, operation=op,
                               transaction_properties={"zg.message": f"rows {lo}-{hi - 1} of {n_rows}"})
        st["versions"][n] = lance.LanceDataset.commit(path, tx).version
        st["stats"][n] = boundary_stats.combine(st["stats"].get(n, boundary_stats.empty()), res["stats"][n])
        if sleep_mid and st["rows_done"] > 0:
            time.sleep(sleep_mid)
    st["rows_done"] = hi
    st.setdefault("shards", []).append([lo, hi])  # shards, or commit groups of a one-process run
    journal.save()
    if sleep:
        time.sleep(sleep)


def _remove_orphans(stage: Path, names: list[str]) -> None:
    """Delete data files the latest version does not reference: written by attempts that were never committed."""
    import lance

    for n in names:
        path = stage / f"{n}.lance"
        keep = {d.path for f in lance.dataset(str(path)).get_fragments() for d in f.data_files()}
        for p in (path / "data").iterdir():
            if p.name not in keep:
                p.unlink()

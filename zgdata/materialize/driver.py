"""Materialize teacher boundaries: one forward per batch, every partition boundary captured.

Writes go to a staging area ``data/.staging/<run>/hNN.lance`` (``run`` is keyed by the fingerprints;
zgdata/materialize/staging.py), committed in groups of rows, with a journal that records each
boundary's committed Lance version. A killed run resumes from the journal: datasets that got one
commit further are rolled back to the journaled version, so all boundaries stay aligned.
Only complete datasets are moved (renamed) into ``data/boundaries/``.

With ``materialize.workers`` > 1 the rows are captured data-parallel in shards on Ray
(zgdata/materialize/sharded.py), otherwise in this process (zgdata/materialize/writer.py). Staging,
journal, stats and finalization are shared, so the datasets hold the same values either way and a
run of one kind resumes the other.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from zgdata.config import MaterializeConfig, PartitionConfig
from zgdata.core.hashing import sha256_bytes
from zgdata.core.lock import locked, remove_dead_staging
from zgdata.core.progress import progress
from zgdata.core.timing import span
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import boundary_fingerprint, boundary_lineage, check, read_tokens_json, software_versions
from zgdata.materialize.staging import Journal, boundary_schema, finalize, reconcile, remove_orphans
from zgdata.materialize.virtual import stored
from zgdata.materialize.writer import run_local
from zgdata.store.codec import FORMAT_OF, codec_meta, codec_of
from zgdata.store.lance_io import open_dataset, schema_meta
from zgdata.teacher.prepare import read_teacher_json

__all__ = ["materialize", "MaterializeResult", "estimate_bytes", "JOURNAL_VERSION"]

BYTES = {"bfloat16": 2, "float32": 4}
# Part of the staging key: 2 keeps exact stats (zgdata/materialize/stats.py) in the journal, so a
# staging dir journaled by an older zg (float sums) is never resumed; it is removed as dead staging.
JOURNAL_VERSION = 2


@dataclass(kw_only=True)
class MaterializeResult:
    paths: dict[str, Path]
    fingerprints: dict[str, str]
    rows: int
    tokens: int
    seconds: float
    resumed_from: int = 0
    skipped: bool = False
    stats: dict = field(default_factory=dict)
    shards: list = field(default_factory=list)  # sharded runs: per shard lo, hi, host, pid, threads, seconds, ...


ROW_EXTRA = 64  # bytes a stored row adds beside its hidden states: seq_id, split, checksum, offsets
DATASET_EXTRA = 1 << 20  # per boundary: Lance manifests and transaction files (one per commit group), block rounding


def estimate_bytes(rows: int, seq_len: int, hidden: int, storage_dtype: str, boundaries: int, *, done: int = 0) -> int:
    """Peak bytes materialize adds on the staging disk (an upper bound for a compressing codec): the ``rows - done``
    rows still to capture, staged, plus finalize's compaction, which rewrites every staged row into new files while
    the staged fragments stay until the staging dir is removed (publishing hard-links the compacted files)."""
    row = seq_len * hidden * BYTES[storage_dtype] + ROW_EXTRA
    return ((rows - done + rows) * row + DATASET_EXTRA) * boundaries


def _gb(n: float) -> str:
    """Bytes as GB, with enough digits that a small amount never prints as 0.00."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e9:.2g} GB"


def _check_disk(need: int, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if need * 1.05 > free:
        raise ZgError(
            f"not enough free disk at {where}: materialize needs about {_gb(need)} "
            f"(the rows staged, then compacted into a second copy by finalize) but {_gb(free)} is free",
            fix="free space, store fewer boundaries, or cap corpus.max_train_seqs",
        )


def _complete(path: Path, fp: str, rows: int, codec: str) -> bool:
    try:  # also refuses another boundary format version: an old-format dataset is rewritten
        ds = open_dataset(path, kind="boundary")
        meta = schema_meta(ds.schema)
        return meta.get("fingerprint") == fp and codec_of(meta) == codec and ds.count_rows() == rows
    except ZgError:
        return False


@locked("materialize")
def materialize(
    cfg: MaterializeConfig, partition: PartitionConfig, *, layout: Layout = Layout(), sharded: bool | None = None
) -> MaterializeResult:
    """Capture every partition boundary into data/boundaries/ (resumable; a no-op when up to date).

    ``sharded``: capture on Ray in shards; default ``cfg.workers > 1`` (the benchmark forces one worker).
    """
    t0 = time.perf_counter()
    teacher = read_teacher_json(layout)
    tmeta = read_tokens_json(layout)
    check(
        "data/tokens.lance",
        tmeta["lineage"],
        "the teacher",
        teacher,
        keys=("tokenizer_sha256",),
        key="teacher.source",
        fix="re-run `dvc repro tokens` so the tokens come from this teacher's tokenizer",
    )
    arch = teacher["architecture"]
    partition.check_depth(arch["num_layers"])
    names, layers = stored(
        partition, cfg
    )  # materialize.virtual_first: h00 is recomputed by its readers (zgdata/materialize/virtual.py)
    lineages = {n: boundary_lineage(teacher, tmeta, layer, cfg) for n, layer in zip(names, layers)}
    fps = {n: boundary_fingerprint(lin) for n, lin in lineages.items()}
    rows_by_split = tmeta["rows"]
    n_rows = sum(rows_by_split.values())
    seq_len, hidden = tmeta["lineage"]["seq_len"], arch["hidden_size"]
    finals = {n: layout.boundary(n) for n in names}
    # keyed by the format too: a run interrupted under an older format must not be resumed into this one
    key = {**fps, "zg.format_version": FORMAT_OF[cfg.codec], "zg.journal": JOURNAL_VERSION}
    if cfg.codec != "raw":
        key["zg.codec"] = cfg.codec
    stage = layout.staging / sha256_bytes(json.dumps(key, sort_keys=True).encode())[:16]
    remove_dead_staging(layout, keep=stage)
    if all(_complete(finals[n], fps[n], n_rows, cfg.codec) for n in names):
        return MaterializeResult(
            paths=finals,
            fingerprints=fps,
            rows=n_rows,
            tokens=n_rows * seq_len,
            seconds=time.perf_counter() - t0,
            skipped=True,
        )

    stage.mkdir(parents=True, exist_ok=True)
    journal = Journal(stage / "journal.json")
    reconcile(stage, names, journal)
    start = journal.state["rows_done"]
    _check_disk(estimate_bytes(n_rows, seq_len, hidden, cfg.storage_dtype, len(names), done=start), layout.staging)

    schemas = {}
    for n, layer in zip(names, layers):
        meta = {
            "kind": "boundary",
            "name": n,
            "layer": layer,
            "fingerprint": fps[n],
            "lineage": lineages[n],
            "software": software_versions(),
            "seq_len": seq_len,
            "hidden": hidden,
            "rows": rows_by_split,
            "format_version": FORMAT_OF[cfg.codec],
            "codec": codec_meta(cfg.codec),
            "complete": False,
        }
        schemas[n] = boundary_schema(meta, seq_len, hidden, cfg.storage_dtype, cfg.codec)
    sharded = cfg.workers > 1 if sharded is None else sharded
    shards: list = []
    with progress("materialize", n_rows * seq_len, completed=start * seq_len) as advance:
        if sharded:
            from zgdata.materialize.sharded import run_sharded

            expect = {"teacher_sha256": teacher["weights_sha256"], "tokens_fingerprint": tmeta["fingerprint"]}
            shards = run_sharded(
                cfg,
                layout=layout,
                stage=stage,
                names=names,
                layers=layers,
                schemas=schemas,
                journal=journal,
                n_rows=n_rows,
                seq_len=seq_len,
                hidden=hidden,
                expect=expect,
                advance=advance,
            )
        else:
            run_local(
                cfg,
                layout=layout,
                stage=stage,
                names=names,
                layers=layers,
                schemas=schemas,
                journal=journal,
                n_rows=n_rows,
                seq_len=seq_len,
                hidden=hidden,
                start=start,
                advance=advance,
            )
    remove_orphans(stage, names)  # files of a group (or shard) that a killed run wrote but never committed
    with span("materialize.finalize"):
        stats = finalize(
            stage,
            names,
            journal,
            finals,
            n_rows=n_rows,
            row_bytes=seq_len * hidden * BYTES[cfg.storage_dtype],
            file_mb=cfg.file_mb,
        )
    shutil.rmtree(stage, ignore_errors=True)
    return MaterializeResult(
        paths=finals,
        fingerprints=fps,
        rows=n_rows,
        tokens=n_rows * seq_len,
        seconds=time.perf_counter() - t0,
        resumed_from=start,
        stats=stats,
        shards=shards,
    )

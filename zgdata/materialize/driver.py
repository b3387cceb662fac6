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
from dataclasses import dataclass, field, replace
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
from zgdata.store import integrity
from zgdata.store.codec import CHECKSUM_FORMAT, codec_meta, codec_of, format_of
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


def _complete(path: Path, fp: str, rows: int, codec: str, config_sha: str | None) -> bool:
    try:  # also refuses another boundary format version: an old-format dataset is rewritten
        ds = open_dataset(path, kind="boundary")
        meta = schema_meta(ds.schema)
        same_config = meta.get(CONFIG_KEY, config_sha) == config_sha  # recorded since: older datasets do not say
        current = meta.get("fingerprint") == fp and codec_of(meta) == codec and same_config
        return current and ds.count_rows() == rows and _intact(path, ds.version)
    except ZgError:
        return False


def _intact(path: Path, version: int) -> bool:
    """A complete boundary's bytes are what dvc.lock records (md5, known by stat once checked), or, where they differ
    or nothing records them, every row matches its checksum. A damaged data file makes the boundary stale, so it is
    captured again: it was called up to date (only `zg data verify` found it)."""
    from zgdata.store.reader import BoundaryDataset
    from zgdata.trust import dvc_lock

    try:
        if dvc_lock.verify(path).outputs:
            return True
    except ZgError:
        pass  # not what git records (damaged, or captured since): the rows decide
    _, bad = BoundaryDataset(path, version=version).scan()  # by version: not trust-checked again; unreadable: stale
    return not bad


@dataclass(frozen=True)
class _Plan:
    """What one materialize run captures: the boundaries, their lineage and fingerprints, the rows' shape."""

    teacher: dict
    tmeta: dict
    names: list
    layers: list
    lineages: dict
    fps: dict
    n_rows: int
    seq_len: int
    hidden: int


def _plan(cfg: MaterializeConfig, partition: PartitionConfig, layout: Layout) -> _Plan:
    """Read the teacher's and the token set's records, check they belong together, and name what to capture."""
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
    # materialize.virtual_first: h00 is recomputed by its readers (zgdata/materialize/virtual.py)
    names, layers = stored(partition, cfg)
    lineages = {n: boundary_lineage(teacher, tmeta, layer, cfg) for n, layer in zip(names, layers)}
    fps = {n: boundary_fingerprint(lin) for n, lin in lineages.items()}
    n_rows = sum(tmeta["rows"].values())
    return _Plan(teacher, tmeta, names, layers, lineages, fps, n_rows, tmeta["lineage"]["seq_len"], arch["hidden_size"])


def _only(plan: _Plan, names: list[str]) -> _Plan:
    """PLAN narrowed to the boundaries NAMES (in the partition's order)."""
    keep = [i for i, n in enumerate(plan.names) if n in names]
    return replace(
        plan,
        names=[plan.names[i] for i in keep],
        layers=[plan.layers[i] for i in keep],
        lineages={n: plan.lineages[n] for n in names},
        fps={n: plan.fps[n] for n in names},
    )


# The teacher's config.json (sha256, from teacher.json's files) is recorded beside the lineage: the fingerprint hashes
# the weights, and an edited config (rms_norm_eps, rope) re-prepared with the same weights computes other boundaries.
# DVC reruns materialize on it (models/teacher/hf is a dep); a direct `zg data materialize`, or a killed one's
# staging, must not keep or resume boundaries of the other config.
CONFIG_KEY = "teacher_config_sha256"


def _config_sha(plan: _Plan) -> str | None:
    return (plan.teacher.get("files") or {}).get("config.json")


def _stage_dir(plan: _Plan, cfg: MaterializeConfig, layout: Layout, checksum: str) -> Path:
    """The staging folder of this run, keyed by every fingerprint and by the format: a run interrupted under an
    older format (or codec, or row checksum) must not be resumed into this one."""
    key = {**plan.fps, "zg.format_version": format_of(cfg.codec, checksum), "zg.journal": JOURNAL_VERSION}
    if cfg.codec != "raw":
        key["zg.codec"] = cfg.codec
    if checksum != "blake2b":
        key["zg.checksum"] = checksum
    if config := _config_sha(plan):
        key["zg.teacher_config"] = config
    return layout.staging / sha256_bytes(json.dumps(key, sort_keys=True).encode())[:16]


def _captured(stage: Path, names: list[str], n_rows: int) -> bool:
    """Whether ``stage`` journals every row of the boundaries ``names``: a run's capture, finished and killed while
    finalize published its boundaries one by one. The narrowed plan of a rerun keys another staging folder, which
    would drop this one and capture those boundaries again."""
    try:
        state = json.loads((stage / "journal.json").read_text())
        return state["rows_done"] == n_rows and all(n in state["versions"] for n in names)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _schemas(plan: _Plan, cfg: MaterializeConfig, checksum: str) -> dict:
    """Each boundary's Lance schema with its metadata (lineage, fingerprint, format, row checksum; ``complete``
    false until finalize). The checksum is recorded beside the lineage, never in it: the fingerprint is the same
    whichever algorithm guards the rows."""
    fmt, config = format_of(cfg.codec, checksum), _config_sha(plan)
    schemas = {}
    for n, layer in zip(plan.names, plan.layers):
        meta = {
            "kind": "boundary",
            "name": n,
            "layer": layer,
            "fingerprint": plan.fps[n],
            "lineage": plan.lineages[n],
            "software": software_versions(),
            "seq_len": plan.seq_len,
            "hidden": plan.hidden,
            "rows": plan.tmeta["rows"],
            "format_version": fmt,
            "codec": codec_meta(cfg.codec),
            "complete": False,
        }
        if fmt >= CHECKSUM_FORMAT:  # formats 2 and 3 name no algorithm: blake2b
            meta["checksum"] = checksum
        if config:
            meta[CONFIG_KEY] = config
        schemas[n] = boundary_schema(meta, plan.seq_len, plan.hidden, cfg.storage_dtype, cfg.codec)
    return schemas


def _capture(plan: _Plan, cfg, *, layout, stage, journal, start: int, sharded: bool, checksum: str) -> list:
    """The teacher pass from row ``start`` into the staging folder, on Ray shards or in this process; the shards'
    reports (none in this process)."""
    run = dict(
        layout=layout,
        stage=stage,
        names=plan.names,
        layers=plan.layers,
        schemas=_schemas(plan, cfg, checksum),
        checksum=checksum,
        journal=journal,
        n_rows=plan.n_rows,
        seq_len=plan.seq_len,
        hidden=plan.hidden,
    )
    with progress("materialize", plan.n_rows * plan.seq_len, completed=start * plan.seq_len) as advance:
        if sharded:
            from zgdata.materialize.sharded import run_sharded

            expect = {"teacher_sha256": plan.teacher["weights_sha256"], "tokens_fingerprint": plan.tmeta["fingerprint"]}
            return run_sharded(cfg, **run, expect=expect, advance=advance)
        run_local(cfg, **run, start=start, advance=advance)
    return []


@locked("materialize")
def materialize(
    cfg: MaterializeConfig, partition: PartitionConfig, *, layout: Layout = Layout(), sharded: bool | None = None
) -> MaterializeResult:
    """Capture every partition boundary into data/boundaries/ (resumable; a no-op when up to date).

    ``sharded``: capture on Ray in shards; default ``cfg.workers > 1`` (the benchmark forces one worker).
    """
    t0 = time.perf_counter()
    full = _plan(cfg, partition, layout)
    n_rows = full.n_rows
    done = dict(
        paths={n: layout.boundary(n) for n in full.names},
        fingerprints=full.fps,
        rows=n_rows,
        tokens=n_rows * full.seq_len,
    )
    # only what is missing or stale: a complete boundary keeps its files, so the blocks that read it stay valid
    config_sha = _config_sha(full)
    stale = [n for n in full.names if not _complete(layout.boundary(n), full.fps[n], n_rows, cfg.codec, config_sha)]
    plan = _only(full, stale)
    names = plan.names
    finals = {n: layout.boundary(n) for n in names}
    checksum = integrity.WRITE_CHECKSUM  # read at run time: a test writes blake2b datasets as an older zg did
    stage = _stage_dir(plan, cfg, layout, checksum)
    if names != full.names and _captured(whole := _stage_dir(full, cfg, layout, checksum), names, n_rows):
        stage = whole  # a run killed while it renamed its boundaries into place: publish the rest of its capture
    remove_dead_staging(layout, keep=stage)
    if not names:
        return MaterializeResult(**done, seconds=time.perf_counter() - t0, skipped=True)

    stage.mkdir(parents=True, exist_ok=True)
    journal = Journal(stage / "journal.json")
    reconcile(stage, names, journal)
    start = journal.state["rows_done"]
    need = estimate_bytes(n_rows, plan.seq_len, plan.hidden, cfg.storage_dtype, len(names), done=start)
    _check_disk(need, layout.staging)
    sharded = cfg.workers > 1 if sharded is None else sharded
    shards = (
        _capture(
            plan, cfg, layout=layout, stage=stage, journal=journal, start=start, sharded=sharded, checksum=checksum
        )
        if start < n_rows
        else []  # captured before a kill in finalize: no teacher to load
    )
    remove_orphans(stage, names)  # files of a group (or shard) that a killed run wrote but never committed
    with span("materialize.finalize"):
        row_bytes = plan.seq_len * plan.hidden * BYTES[cfg.storage_dtype]
        stats = finalize(stage, names, journal, finals, n_rows=n_rows, row_bytes=row_bytes, file_mb=cfg.file_mb)
    shutil.rmtree(stage, ignore_errors=True)
    return MaterializeResult(**done, seconds=time.perf_counter() - t0, resumed_from=start, stats=stats, shards=shards)

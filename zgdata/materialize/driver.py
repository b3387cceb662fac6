"""Materialize teacher boundaries: one forward per batch, every partition boundary captured.

Writes go to ``data/.staging/<run>/hNN.lance`` (``run`` is keyed by the fingerprints),
committed every ``commit_rows`` sequences, with a journal that records each boundary's
committed Lance version. A killed run resumes from the journal: datasets that got one
commit further are rolled back to the journaled version, so all boundaries stay aligned.
Only complete datasets are moved (renamed) into ``data/boundaries/``.

With ``materialize.workers`` > 1 the rows are captured data-parallel in shards on Ray
(zgdata/materialize/sharded.py); staging, journal, stats and finalization are shared, so
the datasets hold the same values either way and a run of one kind resumes the other.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.materialize import stats as boundary_stats
from zgdata.atomic import replace_path, write_text
from zgdata.capture import capture
from zgdata.codec import FORMAT_OF, codec_meta, codec_of, hidden_arrays, hidden_fields
from zgdata.config import MaterializeConfig, PartitionConfig
from zgdata.errors import ZgError
from zgdata.hashing import sha256_bytes
from zgdata.integrity import CHECKSUM_BYTES, CHECKSUM_COLUMN, checksum_array
from zgdata.lance_io import encode_meta, open_dataset, schema_meta
from zgdata.layout import Layout
from zgdata.lineage import boundary_fingerprint, boundary_lineage, check, read_tokens_json, software_versions
from zgdata.lock import locked, remove_dead_staging
from zgdata.progress import progress
from zgdata.teacher.prepare import load_teacher, read_teacher_json
from zgdata.timing import span
from zgdata.tokens import open_tokens, read_tokens
from zgdata.virtual import stored

__all__ = ["materialize", "MaterializeResult", "estimate_bytes", "boundary_schema", "JOURNAL_VERSION"]

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


def estimate_bytes(rows: int, seq_len: int, hidden: int, storage_dtype: str, boundaries: int) -> int:
    return rows * seq_len * hidden * BYTES[storage_dtype] * boundaries


def _gb(n: float) -> str:
    """Bytes as GB, with enough digits that a small amount never prints as 0.00."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e9:.2g} GB"


def _check_disk(need: int, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if need * 1.05 > free:
        raise ZgError(f"not enough free disk at {where}: materialize needs about {_gb(need)} "
                      f"(rows x seq_len x hidden x bytes x boundaries) but {_gb(free)} is free",
                      fix="free space, store fewer boundaries, or cap corpus.max_train_seqs")


def _complete(path: Path, fp: str, rows: int, codec: str) -> bool:
    try:  # also refuses another boundary format version: an old-format dataset is rewritten
        ds = open_dataset(path, kind="boundary")
        meta = schema_meta(ds.schema)
        return meta.get("fingerprint") == fp and codec_of(meta) == codec and ds.count_rows() == rows
    except ZgError:
        return False


class _Journal:
    def __init__(self, path: Path):
        self.path = path
        self.state = json.loads(path.read_text()) if path.exists() else {"rows_done": 0, "versions": {}, "stats": {}}

    def save(self) -> None:
        write_text(self.path, json.dumps(self.state, sort_keys=True))  # compact: rewritten after every commit


def _reconcile(stage: Path, names: list[str], journal: _Journal) -> None:
    """Roll every staged dataset back to its journaled version (or remove it if none was journaled)."""
    import lance

    for name in names:
        path = stage / f"{name}.lance"
        want = journal.state["versions"].get(name)
        if want is None:
            shutil.rmtree(path, ignore_errors=True)
            continue
        ds = lance.dataset(str(path))
        if ds.version != want:  # one commit further, or compacted by an interrupted finalize
            lance.dataset(str(path), version=want).restore()


class _Writer(threading.Thread):
    """Background writer: bounded queue in; each commit group streams into one Lance data file per boundary.

    A group closes at ``commit_rows`` rows (0: no row bound), ``commit_mb`` of hidden states (all
    boundaries) or ``commit_seconds``, whichever comes first; it is then committed (one Lance version
    per boundary) and journaled, exactly as a shard of a sharded run (materialize_sharded._commit).
    A killed run therefore loses at most the open group; its written but uncommitted files are
    orphans, deleted before publishing. Memory stays a few batches whatever the group size.
    """

    def __init__(self, *, stage, names, schemas, journal, cfg, total_rows, seq_len, hidden):
        super().__init__(daemon=True)
        self.q: queue.Queue = queue.Queue(maxsize=cfg.queue_batches)
        self.stage, self.names, self.schemas, self.journal, self.cfg = stage, names, schemas, journal, cfg
        self.total_rows = total_rows
        self.bare = boundary_schema(None, seq_len, hidden, cfg.storage_dtype, cfg.codec)
        self.group = None  # the open group: streams, first and next row, stats, bytes, start time
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while (item := self.q.get()) is not None:
                self._add(*item)
                g = self.group
                if ((self.cfg.commit_rows and g["hi"] - g["lo"] >= self.cfg.commit_rows)
                        or g["bytes"] >= self.cfg.commit_mb * 2**20
                        or time.monotonic() - g["t0"] >= self.cfg.commit_seconds):
                    self._flush()
            self._flush()
        except BaseException as e:  # surfaced by the main thread
            self.error = e
            if self.group is not None:
                self.group["streams"].close(abort=True)

    def _add(self, rows, splits, caps) -> None:
        from zgdata.materialize.shard_task import _Streams

        if self.group is None:
            # one writer per dataset here: "create" until the first commit spares Lance's "no dataset" warning
            fresh = not any((self.stage / f"{n}.lance" / "_versions").exists() for n in self.names)
            self.group = {"streams": _Streams(self.stage, self.names, self.bare, rows_per_file=2**31 - 1,
                                              mode="create" if fresh else "append"),
                          "lo": int(rows[0]), "hi": int(rows[0]), "bytes": 0, "t0": time.monotonic(),
                          "stats": {n: boundary_stats.empty() for n in self.names}}
        g = self.group
        for name in self.names:
            x = caps[name]                                                   # (N, T, C) storage dtype
            g["stats"][name] = boundary_stats.combine(g["stats"][name], boundary_stats.batch_stats(x))
            values, bits = hidden_arrays(x, self.cfg.storage_dtype, self.cfg.codec)
            g["streams"].put(name, pa.RecordBatch.from_arrays(
                [pa.array(rows, type=pa.int64()), pa.array(splits), *values, checksum_array(bits)], schema=self.bare))
            g["bytes"] += x.numel() * x.element_size()
        g["hi"] = int(rows[-1]) + 1

    def _flush(self) -> None:
        from zgdata.materialize.sharded import _commit

        g, self.group = self.group, None
        if g is None:
            return
        with span("materialize.commit", rows=g["hi"] - g["lo"], nbytes=g["bytes"]):
            fragments = g["streams"].close()
            _commit(self.stage, self.names, self.schemas, self.journal,
                    {"lo": g["lo"], "hi": g["hi"], "fragments": fragments, "stats": g["stats"]}, self.total_rows)


def boundary_schema(meta: dict | None, seq_len: int, hidden: int, storage_dtype: str, codec: str = "raw") -> pa.Schema:
    """The Arrow schema of a boundary dataset (``meta``: its zg.* schema metadata, or None for the bare fields)."""
    return pa.schema([pa.field("seq_id", pa.int64()), pa.field("split", pa.string()),
                      *hidden_fields(seq_len, hidden, storage_dtype, codec),
                      pa.field(CHECKSUM_COLUMN, pa.binary(CHECKSUM_BYTES))],
                     metadata=encode_meta(meta) if meta is not None else None)


@locked("materialize")
def materialize(cfg: MaterializeConfig, partition: PartitionConfig, *, layout: Layout = Layout(),
                sharded: bool | None = None) -> MaterializeResult:
    """Capture every partition boundary into data/boundaries/ (resumable; a no-op when up to date).

    ``sharded``: capture on Ray in shards; default ``cfg.workers > 1`` (the benchmark forces one worker).
    """
    t0 = time.perf_counter()
    teacher = read_teacher_json(layout)
    tmeta = read_tokens_json(layout)
    check("data/tokens.lance", tmeta["lineage"], "the teacher", teacher, keys=("tokenizer_sha256",),
          key="teacher.source", fix="re-run `dvc repro tokens` so the tokens come from this teacher's tokenizer")
    arch = teacher["architecture"]
    partition.check_depth(arch["num_layers"])
    names, layers = stored(partition, cfg)  # materialize.virtual_first: h00 is recomputed by its readers (zgdata/virtual.py)
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
        return MaterializeResult(paths=finals, fingerprints=fps, rows=n_rows, tokens=n_rows * seq_len,
                                 seconds=time.perf_counter() - t0, skipped=True)

    stage.mkdir(parents=True, exist_ok=True)
    journal = _Journal(stage / "journal.json")
    _reconcile(stage, names, journal)
    start = journal.state["rows_done"]
    _check_disk(estimate_bytes(n_rows - start, seq_len, hidden, cfg.storage_dtype, len(names)), layout.staging)

    schemas = {}
    for n, layer in zip(names, layers):
        meta = {"kind": "boundary", "name": n, "layer": layer, "fingerprint": fps[n], "lineage": lineages[n],
                "software": software_versions(), "seq_len": seq_len, "hidden": hidden, "rows": rows_by_split,
                "format_version": FORMAT_OF[cfg.codec], "codec": codec_meta(cfg.codec), "complete": False}
        schemas[n] = boundary_schema(meta, seq_len, hidden, cfg.storage_dtype, cfg.codec)
    sharded = cfg.workers > 1 if sharded is None else sharded
    shards: list = []
    with progress("materialize", n_rows * seq_len, completed=start * seq_len) as advance:
        if sharded:
            from zgdata.materialize.sharded import run_sharded

            expect = {"teacher_sha256": teacher["weights_sha256"], "tokens_fingerprint": tmeta["fingerprint"]}
            shards = run_sharded(cfg, layout=layout, stage=stage, names=names, layers=layers, schemas=schemas,
                                 journal=journal, n_rows=n_rows, seq_len=seq_len, hidden=hidden, expect=expect,
                                 advance=advance)
        else:
            _run_local(cfg, layout=layout, stage=stage, names=names, layers=layers, schemas=schemas, journal=journal,
                       n_rows=n_rows, seq_len=seq_len, hidden=hidden, start=start, advance=advance)
    from zgdata.materialize.sharded import _remove_orphans

    _remove_orphans(stage, names)  # files of a group (or shard) that a killed run wrote but never committed
    with span("materialize.finalize"):
        stats = _finalize(stage, names, journal, finals, n_rows=n_rows, row_bytes=seq_len * hidden * BYTES[cfg.storage_dtype],
                          file_mb=cfg.file_mb)
    shutil.rmtree(stage, ignore_errors=True)
    return MaterializeResult(paths=finals, fingerprints=fps, rows=n_rows, tokens=n_rows * seq_len,
                             seconds=time.perf_counter() - t0, resumed_from=start, stats=stats, shards=shards)


def _run_local(cfg, *, layout, stage, names, layers, schemas, journal, n_rows, seq_len, hidden, start, advance) -> None:
    """One process: teacher forward in this thread, Lance commits in a background writer thread."""
    with span("materialize.load_teacher"):
        model, _ = load_teacher(layout, dtype=cfg.compute_dtype, with_tokenizer=False, per_layer=True)
    storage = getattr(torch, cfg.storage_dtype)
    writer = _Writer(stage=stage, names=names, schemas=schemas, journal=journal, cfg=cfg, total_rows=n_rows,
                     seq_len=seq_len, hidden=hidden)
    tokens_ds = open_tokens(layout)
    writer.start()
    try:
        for lo in range(start, n_rows, cfg.batch_size):
            rows = np.arange(lo, min(lo + cfg.batch_size, n_rows))
            with span("materialize.read_tokens", rows=len(rows)):
                ids, splits = read_tokens(layout, rows, ds=tokens_ds)
            with span("materialize.capture", rows=len(rows)):
                caps = capture(model, ids, layers, storage_dtype=storage)
            while True:  # never block forever on a dead writer
                if writer.error is not None:
                    raise writer.error
                try:
                    writer.q.put((rows, splits, {n: caps[layer] for n, layer in zip(names, layers)}), timeout=1)
                    break
                except queue.Full:
                    continue
            advance(len(rows) * seq_len)
    finally:
        if writer.is_alive():
            writer.q.put(None)
            writer.join()
    if writer.error is not None:
        raise writer.error


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same file system: no bytes copied
    except OSError:
        shutil.copyfile(src, dst)


def _finalize(stage: Path, names: list[str], journal: _Journal, finals: dict[str, Path], *, n_rows: int,
              row_bytes: int, file_mb: int) -> dict:
    """Compact each staged boundary into large files and publish it as a new dataset of one version.

    The staged dataset has one version per commit group. Finalize compacts its fragments into files
    of about ``file_mb`` (Lance ``compact_files``), then links those files into a fresh dataset whose
    version 1 is an Overwrite of them with the complete schema metadata and a message saying what
    was materialized, and renames that into place. So a boundary has about rows x row_bytes / file_mb
    files and one version, whatever its size. The staged dataset is left intact until the staging
    dir is removed, so a run killed here redoes this step from the journal.
    """
    import lance

    stats = {}
    groups = len(journal.state.get("shards", [])) or None
    for n in names:
        stats[n] = boundary_stats.summary(journal.state["stats"][n])
        src, pub = stage / f"{n}.lance", stage / f"{n}.publish.lance"
        ds = lance.dataset(str(src))
        if len(ds.get_fragments()) > 1:
            with span("materialize.compact", rows=n_rows):
                ds.optimize.compact_files(target_rows_per_fragment=max(1, file_mb * 2**20 // row_bytes),
                                          compaction_mode="try_binary_copy", num_threads=1)
                ds = lance.dataset(str(src))
        frags = ds.get_fragments()
        shutil.rmtree(pub, ignore_errors=True)
        (pub / "data").mkdir(parents=True)
        for f in frags:
            for d in f.data_files():
                _link_or_copy(src / "data" / d.path, pub / "data" / d.path)
        schema = ds.schema.with_metadata({**ds.schema.metadata, **{k.encode(): v.encode() for k, v in
                                                                   encode_meta({"stats": stats[n], "complete": True}).items()}})
        msg = (f"materialized rows 0-{n_rows - 1}" + (f" in {groups} commit groups" if groups else "")
               + f", {len(frags)} data file{'s' if len(frags) != 1 else ''}")
        tx = lance.Transaction(read_version=0, operation=lance.LanceOperation.Overwrite(schema, [f.metadata for f in frags]),
                               transaction_properties={"zg.message": msg})
        lance.LanceDataset.commit(str(pub), tx)
    for n in names:  # each rename is atomic: data/boundaries/ never holds a half-written dataset
        replace_path(stage / f"{n}.publish.lance", finals[n])
    return stats

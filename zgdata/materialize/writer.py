"""One-process materialize: the teacher forward in the calling thread, Lance commits in a writer thread.

The writer streams each commit group into the staging area (zgdata/materialize/staging.py) and commits
and journals it exactly as the sharded driver commits a shard, so both kinds of run leave the same
staged datasets and resume each other.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pyarrow as pa
import torch

from zgdata.core.timing import span
from zgdata.families.capture import capture
from zgdata.materialize import stats as boundary_stats
from zgdata.materialize.staging import Streams, boundary_schema, commit
from zgdata.store.codec import hidden_arrays
from zgdata.store.integrity import checksum_array
from zgdata.teacher.prepare import load_teacher
from zgdata.tokens.tokenset import open_tokens, read_tokens

__all__ = ["Writer", "run_local"]


class Writer(threading.Thread):
    """Background writer: bounded queue in; each commit group streams into one Lance data file per boundary.

    A group closes at ``commit_rows`` rows (0: no row bound), ``commit_mb`` of hidden states (all
    boundaries) or ``commit_seconds``, whichever comes first; it is then committed (one Lance version
    per boundary) and journaled, exactly as a shard of a sharded run (``staging.commit``).
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
                if (
                    (self.cfg.commit_rows and g["hi"] - g["lo"] >= self.cfg.commit_rows)
                    or g["bytes"] >= self.cfg.commit_mb * 2**20
                    or time.monotonic() - g["t0"] >= self.cfg.commit_seconds
                ):
                    self._flush()
            self._flush()
        except BaseException as e:  # surfaced by the main thread
            self.error = e
            if self.group is not None:
                self.group["streams"].close(abort=True)

    def _add(self, rows, splits, caps) -> None:
        if self.group is None:
            # one writer per dataset here: "create" until the first commit spares Lance's "no dataset" warning
            fresh = not any((self.stage / f"{n}.lance" / "_versions").exists() for n in self.names)
            self.group = {
                "streams": Streams(
                    self.stage, self.names, self.bare, rows_per_file=2**31 - 1, mode="create" if fresh else "append"
                ),
                "lo": int(rows[0]),
                "hi": int(rows[0]),
                "bytes": 0,
                "t0": time.monotonic(),
                "stats": {n: boundary_stats.empty() for n in self.names},
            }
        g = self.group
        for name in self.names:
            x = caps[name]  # (N, T, C) storage dtype
            g["stats"][name] = boundary_stats.combine(g["stats"][name], boundary_stats.batch_stats(x))
            values, bits = hidden_arrays(x, self.cfg.storage_dtype, self.cfg.codec)
            g["streams"].put(
                name,
                pa.RecordBatch.from_arrays(
                    [pa.array(rows, type=pa.int64()), pa.array(splits), *values, checksum_array(bits)], schema=self.bare
                ),
            )
            g["bytes"] += x.numel() * x.element_size()
        g["hi"] = int(rows[-1]) + 1

    def _flush(self) -> None:
        g, self.group = self.group, None
        if g is None:
            return
        with span("materialize.commit", rows=g["hi"] - g["lo"], nbytes=g["bytes"]):
            fragments = g["streams"].close()
            commit(
                self.stage,
                self.names,
                self.schemas,
                self.journal,
                {"lo": g["lo"], "hi": g["hi"], "fragments": fragments, "stats": g["stats"]},
                self.total_rows,
            )


def run_local(cfg, *, layout, stage, names, layers, schemas, journal, n_rows, seq_len, hidden, start, advance) -> None:
    """One process: teacher forward in this thread, Lance commits in a background writer thread."""
    with span("materialize.load_teacher"):
        model, _ = load_teacher(layout, dtype=cfg.compute_dtype, with_tokenizer=False, per_layer=True)
    storage = getattr(torch, cfg.storage_dtype)
    writer = Writer(
        stage=stage,
        names=names,
        schemas=schemas,
        journal=journal,
        cfg=cfg,
        total_rows=n_rows,
        seq_len=seq_len,
        hidden=hidden,
    )
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

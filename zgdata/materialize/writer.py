"""One-process materialize: the teacher forward in the calling thread, Lance commits in a writer thread.

The writer hands each batch's boundaries to a pool of ``materialize.writer_threads`` encoding threads
(zgdata/materialize/encode.py), takes them back in row order, and streams each commit group into the staging area (zgdata/materialize/staging.py) and commits
and journals it exactly as the sharded driver commits a shard, so both kinds of run leave the same
staged datasets and resume each other.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from zgdata.core import host_copy
from zgdata.core.runtime import writer_threads
from zgdata.core.timing import span
from zgdata.materialize import stats as boundary_stats
from zgdata.materialize.encode import Encoder
from zgdata.materialize.forward import captured
from zgdata.materialize.staging import Streams, boundary_schema, commit
from zgdata.teacher.prepare import load_teacher

__all__ = ["Writer", "run_local"]


class Writer(threading.Thread):
    """Background writer: bounded queue in; each commit group streams into one Lance data file per boundary.

    A group closes at ``commit_rows`` rows (0: no row bound), ``commit_mb`` of hidden states (all
    boundaries) or ``commit_seconds``, whichever comes first; it is then committed (one Lance version
    per boundary) and journaled, exactly as a shard of a sharded run (``staging.commit``).
    A killed run therefore loses at most the open group; its written but uncommitted files are
    orphans, deleted before publishing. Memory stays a few batches whatever the group size.
    """

    def __init__(self, *, stage, names, schemas, journal, cfg, total_rows, seq_len, hidden, checksum, threads=None):
        super().__init__(daemon=True)
        self.q: queue.Queue = queue.Queue(maxsize=cfg.queue_batches)
        self.stage, self.names, self.schemas, self.journal, self.cfg = stage, names, schemas, journal, cfg
        self.total_rows = total_rows
        self.bare = boundary_schema(None, seq_len, hidden, cfg.storage_dtype, cfg.codec)
        self.encoder = Encoder(
            threads=writer_threads(cfg.writer_threads) if threads is None else threads,
            schema=self.bare,
            storage_dtype=cfg.storage_dtype,
            codec=cfg.codec,
            checksum=checksum,
        )
        self.group = None  # the open group: streams, first and next row, stats, bytes, start time
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while (item := self.q.get()) is not None:
                self.encoder.submit(*item)
                self._take(keep=None)
            self._take(keep=0)
            self._flush()
        except BaseException as e:  # surfaced by the main thread
            self.error = e
            if self.group is not None:
                self.group["streams"].close(abort=True)
        finally:
            self.encoder.close()

    def _take(self, *, keep) -> None:
        """Stream the encoded batches the pool has finished beyond ``keep`` in flight, in row order; close groups."""
        for rows, encoded in self.encoder.done(keep=keep):
            self._add(rows, encoded)
            g = self.group
            if (
                (self.cfg.commit_rows and g["hi"] - g["lo"] >= self.cfg.commit_rows)
                or g["bytes"] >= self.cfg.commit_mb * 2**20
                or time.monotonic() - g["t0"] >= self.cfg.commit_seconds
            ):
                self._flush()

    def _add(self, rows, encoded) -> None:
        if self.group is None:
            # one writer per dataset here: "create" until the first commit spares Lance's "no dataset" warning
            fresh = not any((self.stage / f"{n}.lance" / "_versions").exists() for n in self.names)
            self.group = {
                "streams": Streams(
                    self.stage,
                    self.names,
                    self.bare,
                    rows_per_file=2**31 - 1,
                    mode="create" if fresh else "append",
                    write_behind=self.cfg.write_behind_mb << 20,
                ),
                "lo": int(rows[0]),
                "hi": int(rows[0]),
                "bytes": 0,
                "t0": time.monotonic(),
                "stats": {n: boundary_stats.empty() for n in self.names},
            }
        g = self.group
        for name in self.names:
            e = encoded[name]
            g["stats"][name] = boundary_stats.combine(g["stats"][name], e.stats)
            g["streams"].put(name, e.batch)
            g["bytes"] += e.nbytes
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


def run_local(
    cfg, *, layout, stage, names, layers, schemas, journal, n_rows, seq_len, hidden, checksum, start, advance
) -> None:
    """One process: teacher forward in this thread (zgdata/materialize/forward.py), Lance commits in a background
    writer thread."""
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
        checksum=checksum,
    )
    writer.start()
    try:
        for rows, splits, caps in captured(
            model, layout, lo=start, hi=n_rows, batch_size=cfg.batch_size, layers=layers, storage=storage
        ):
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
        # Ask the writer to finish what it holds; a failed writer no longer reads the queue (which may be full),
        # so never block on it: it ends once it has dropped its in-flight work.
        while writer.is_alive():
            try:
                writer.q.put(None, timeout=0.2)
                break
            except queue.Full:
                continue
        writer.join()
        host_copy.release()  # a GPU run's cached pinned buffers, now free
    if writer.error is not None:
        raise writer.error

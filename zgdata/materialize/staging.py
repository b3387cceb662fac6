"""The staging area of a materialize run: its datasets, journal, row-ordered commits and publishing.

Both ways of capturing rows write here: the one-process writer (zgdata/materialize/writer.py) and the
sharded driver (zgdata/materialize/sharded.py) with its shard tasks (zgdata/materialize/shard_task.py).
Each streams a group of rows into one Lance data file per boundary (``Streams``), and ``commit`` adds that
group to every staged boundary (one Lance version each) and journals it, always in row order. So the
journal's ``rows_done`` is a committed prefix of the rows whichever way they were captured, and a killed
run of one kind resumes the other: ``reconcile`` rolls back a half-committed group, ``remove_orphans``
deletes files no commit references, and ``finalize`` compacts and publishes each complete dataset.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from pathlib import Path

import pyarrow as pa

from zgdata.core import failpoints
from zgdata.core.atomic import replace_path, sync_entries, sync_tree, write_text
from zgdata.core.timing import span
from zgdata.materialize import stats as boundary_stats
from zgdata.materialize.write_behind import WriteBehind
from zgdata.store.codec import hidden_fields
from zgdata.store.integrity import CHECKSUM_BYTES, CHECKSUM_COLUMN
from zgdata.store.lance_io import encode_meta

__all__ = ["boundary_schema", "Journal", "reconcile", "Streams", "commit", "remove_orphans", "finalize"]


def boundary_schema(meta: dict | None, seq_len: int, hidden: int, storage_dtype: str, codec: str = "raw") -> pa.Schema:
    """The Arrow schema of a boundary dataset (``meta``: its zg.* schema metadata, or None for the bare fields)."""
    return pa.schema(
        [
            pa.field("seq_id", pa.int64()),
            pa.field("split", pa.string()),
            *hidden_fields(seq_len, hidden, storage_dtype, codec),
            pa.field(CHECKSUM_COLUMN, pa.binary(CHECKSUM_BYTES)),
        ],
        metadata=encode_meta(meta) if meta is not None else None,
    )


class Journal:
    """``journal.json`` of a staging dir: rows_done, each boundary's committed Lance version and exact stats."""

    def __init__(self, path: Path):
        self.path = path
        self.state = json.loads(path.read_text()) if path.exists() else {"rows_done": 0, "versions": {}, "stats": {}}

    def save(self) -> None:
        write_text(self.path, json.dumps(self.state, sort_keys=True))  # compact: rewritten after every commit


def reconcile(stage: Path, names: list[str], journal: Journal) -> None:
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


_ABORT = object()

# Lance's writer buffers each column until it holds data_cache_bytes / columns (default 8 MiB a column), then
# concatenates what it buffered into one page. A boundary's value column holds a MiB or more per batch of rows, so
# at 1 MiB a column each batch becomes its own page without that copy, while the small columns (seq_id, split,
# checksum) still gather some 65,000 rows a page. Measured on the raw write path: 0.45-0.51 -> 0.57-0.69 GB/s and
# 1.9-2.7 -> 1.8-2.05 core-seconds per GB (bench/write_path.py, docs/results/write-path.md). The page sizes follow
# from the batches alone, so the bytes still do not depend on the thread count; any Lance reader reads either layout.
CACHE_BYTES_PER_COLUMN = 1 << 20


class Streams:
    """One ``lance.fragment.write_fragments`` per boundary, each fed batches through a small queue by a thread;
    ``write_behind`` bytes: how often their new files are synced meanwhile (zgdata/materialize/write_behind.py)."""

    def __init__(
        self,
        stage: Path,
        names: list[str],
        schema: pa.Schema,
        rows_per_file: int,
        depth: int = 2,
        mode: str = "append",
        write_behind: int = 0,
    ):
        self.mode = mode
        self.behind = WriteBehind([stage / f"{n}.lance" / "data" for n in names], write_behind)
        self.q = {n: queue.Queue(maxsize=depth) for n in names}
        self.out: dict[str, list] = {}
        self.err: dict[str, BaseException] = {}
        self.threads = [
            threading.Thread(target=self._write, args=(stage / f"{n}.lance", n, schema, rows_per_file), daemon=True)
            for n in names
        ]
        for t in self.threads:
            t.start()

    def _write(self, path: Path, name: str, schema: pa.Schema, rows_per_file: int) -> None:
        from lance.fragment import write_fragments

        def batches():
            while (b := self.q[name].get()) is not None:
                if b is _ABORT:
                    raise RuntimeError("shard aborted")
                yield b

        try:
            frags = write_fragments(
                pa.RecordBatchReader.from_batches(schema, batches()),
                str(path),
                schema=schema,
                mode=self.mode,
                max_rows_per_file=rows_per_file,
                data_cache_bytes=CACHE_BYTES_PER_COLUMN * len(schema),
            )
            self.out[name] = [f.to_json() for f in frags]
        except BaseException as e:  # re-raised by put()/close() in the capturing thread
            self.err[name] = e

    def put(self, name: str, item) -> None:
        while True:  # never block forever on a dead writer
            if name in self.err:
                raise self.err[name]
            try:
                self.q[name].put(item, timeout=1)
                break
            except queue.Full:
                continue
        if isinstance(item, pa.RecordBatch):
            self.behind.add(item.nbytes)

    def close(self, *, abort: bool = False) -> dict[str, list]:
        """End every stream (``abort``: drop what they hold) and join their threads and the write-behind thread,
        even when a writer failed meanwhile: a Ray worker process that runs the next shard keeps no thread or
        open file of this one. A writer's error, then write-behind's, is raised after that, unless aborting."""
        try:
            for n in self.q:
                try:
                    self.put(n, _ABORT if abort else None)
                except BaseException as e:
                    if e is not self.err.get(n):  # anything but n's writer's own error (a Ctrl-C) goes on up
                        raise
                    # n's writer died: it takes no end marker, and its error is raised below
            for t in self.threads:
                t.join()
        finally:
            behind = self.behind.close()
        if self.err and not abort:
            raise next(iter(self.err.values()))
        if behind is not None and not abort:
            raise behind
        return self.out


def commit(stage: Path, names: list[str], schemas: dict, journal: Journal, res: dict, n_rows: int) -> None:
    """Commit one group's (or shard's) fragments to every boundary (one Lance version each), then journal it."""
    import lance
    from lance.fragment import FragmentMetadata

    st = journal.state
    lo, hi = res["lo"], res["hi"]
    if lo != st["rows_done"]:  # groups come in row order; anything else is a bug, never a silent gap
        raise RuntimeError(f"shard {lo}-{hi} committed after row {st['rows_done']}")
    for n in names:
        frags = [FragmentMetadata.from_json(json.dumps(f)) for f in res["fragments"][n]]
        path = str(stage / f"{n}.lance")
        # after a rollback (reconcile) the latest version restores the journaled one under a new number
        have = lance.dataset(path).version if st["versions"].get(n) else None
        op = lance.LanceOperation.Append(frags) if have else lance.LanceOperation.Overwrite(schemas[n], frags)
        tx = lance.Transaction(
            read_version=have or 0,
            operation=op,
            transaction_properties={"zg.message": f"rows {lo}-{hi - 1} of {n_rows}"},
        )
        st["versions"][n] = lance.LanceDataset.commit(path, tx).version
        st["stats"][n] = boundary_stats.combine(st["stats"].get(n, boundary_stats.empty()), res["stats"][n])
        if st["rows_done"] > 0:
            failpoints.pause(failpoints.MID_COMMIT)  # a kill here leaves the boundaries one commit apart
    st["rows_done"] = hi
    st.setdefault("shards", []).append([lo, hi])  # shards, or commit groups of a one-process run
    journal.save()
    failpoints.pause(failpoints.AFTER_COMMIT)


def remove_orphans(stage: Path, names: list[str]) -> None:
    """Delete data files the latest version does not reference: written by attempts that were never committed."""
    import lance

    for n in names:
        path = stage / f"{n}.lance"
        keep = {d.path for f in lance.dataset(str(path)).get_fragments() for d in f.data_files()}
        keep |= {Path(k).stem for k in keep}  # a blob boundary's sidecar folder per data file (codec.py)
        for p in (path / "data").iterdir():
            if p.name in keep:
                continue
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same file system: no bytes copied
    except OSError:
        shutil.copyfile(src, dst)


def _compacted(src: Path, *, n_rows: int, rows_per_file: int):
    """The staged dataset at SRC, its commit groups' fragments compacted into files of ``rows_per_file`` rows."""
    import lance

    ds = lance.dataset(str(src))
    if len(ds.get_fragments()) > 1:
        with span("materialize.compact", rows=n_rows):
            ds.optimize.compact_files(
                target_rows_per_fragment=rows_per_file, compaction_mode="try_binary_copy", num_threads=1
            )
            ds = lance.dataset(str(src))
    return ds


def _link_files(src: Path, pub: Path, frags) -> None:
    """A fresh ``pub`` folder holding (linked, or copied) the data files of ``frags`` and their blob sidecars."""
    shutil.rmtree(pub, ignore_errors=True)
    (pub / "data").mkdir(parents=True)
    for f in frags:
        for d in f.data_files():
            _link_or_copy(src / "data" / d.path, pub / "data" / d.path)
            sidecars = src / "data" / Path(d.path).stem  # a blob boundary's packed rows (codec.py)
            if sidecars.is_dir():
                (pub / "data" / sidecars.name).mkdir()
                for b in sorted(sidecars.iterdir()):
                    _link_or_copy(b, pub / "data" / sidecars.name / b.name)


def finalize(
    stage: Path,
    names: list[str],
    journal: Journal,
    finals: dict[str, Path],
    *,
    n_rows: int,
    row_bytes: int,
    file_mb: int,
) -> dict:
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
        ds = _compacted(src, n_rows=n_rows, rows_per_file=max(1, file_mb * 2**20 // row_bytes))
        frags = ds.get_fragments()
        _link_files(src, pub, frags)
        schema = ds.schema.with_metadata(
            {
                **ds.schema.metadata,
                **{k.encode(): v.encode() for k, v in encode_meta({"stats": stats[n], "complete": True}).items()},
            }
        )
        msg = (
            f"materialized rows 0-{n_rows - 1}"
            + (f" in {groups} commit groups" if groups else "")
            + f", {len(frags)} data file{'s' if len(frags) != 1 else ''}"
        )
        tx = lance.Transaction(
            read_version=0,
            operation=lance.LanceOperation.Overwrite(schema, [f.metadata for f in frags]),
            transaction_properties={"zg.message": msg},
        )
        lance.LanceDataset.commit(str(pub), tx)
        sync_tree(pub)  # compact_files' files and the manifest: on the disk before the rename publishes them
    for n in names:  # each rename is atomic: data/boundaries/ never holds a half-written dataset
        replace_path(stage / f"{n}.publish.lance", finals[n])
        failpoints.pause(failpoints.AFTER_PUBLISH)  # a kill here leaves some boundaries published (driver.py)
    for folder in sorted({finals[n].parent for n in names}):
        sync_entries(folder)
    return stats

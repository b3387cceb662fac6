"""Record corpora read in Arrow batches: Parquet (a file or a directory of them), a ``datasets`` ``save_to_disk``
directory (its data-*.arrow IPC streams, read with pyarrow: no ``datasets`` import) and Lance datasets, scanned in
stored order. Each record is one document; a record without an id is ``STEM#ROW``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from zgdata.config import CorpusConfig
from zgdata.errors import ZgError
from zgdata.tokens.documents import KEY, Doc, Source, detect, record_doc, stem

__all__ = ["read_records"]

BATCH_ROWS = 1024  # records per pyarrow/Lance batch: bounds memory for long texts


def _unreadable(path: Path, what: str, e: BaseException, *, fix: str) -> ZgError:
    return ZgError(f"{path} is not a readable {what}: {str(e)[:120]}", key=KEY, fix=fix)


RESAVE = "save the dataset again with Dataset.save_to_disk (a copy cut short? copy it again)"
REWRITE = "rewrite it, or drop it from corpus.source"


def _guarded(batches, where: Path, what: str, fix: str) -> Iterator:
    """``batches``, with a read error of one (a truncated or damaged file) as one line naming the file."""
    import pyarrow as pa

    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(where, what, e, fix=fix) from e
        yield batch


def _columns(names: list[str], where: Path, cfg: CorpusConfig) -> list[str]:
    if cfg.text_field not in names:
        raise ZgError(
            f"{where} has no column '{cfg.text_field}' (columns: {', '.join(names)[:160]})",
            key="corpus.text_field",
            fix="set corpus.text_field to the text column",
        )
    if cfg.heldout_field and cfg.heldout_field not in names:
        raise ZgError(
            f"{where} has no column '{cfg.heldout_field}' (columns: {', '.join(names)[:160]})",
            key="corpus.heldout_field",
            fix="set corpus.heldout_field to an existing column",
        )
    cols = [cfg.text_field]
    cols += [c for c in (cfg.id_field, cfg.heldout_field) if c and c in names and c not in cols]
    return cols


def _batches(src: Source, cfg: CorpusConfig):
    """(where, record batches) per file of a batch source, in stored order."""
    import pyarrow as pa

    path = src.path
    if src.format == "parquet":
        import pyarrow.parquet as pq

        files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
        if not files:
            raise ZgError(f"{path} holds no .parquet file", key=KEY, fix="point corpus.source at Parquet data")
        for f in files:
            try:
                pf = pq.ParquetFile(f)
            except (pa.ArrowException, OSError) as e:
                raise _unreadable(f, "Parquet file", e, fix=REWRITE) from e
            cols = _columns(pf.schema_arrow.names, f, cfg)
            yield f, _guarded(pf.iter_batches(batch_size=BATCH_ROWS, columns=cols), f, "Parquet file", REWRITE)
    elif src.format == "hf_disk":
        if detect(path) != "hf_disk":
            raise ZgError(
                f"{path} has no state.json: not a directory written by `datasets` save_to_disk",
                key=KEY,
                fix="point corpus.source at the directory Dataset.save_to_disk wrote",
            )
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / d["filename"] for d in state.get("_data_files", [])]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise _unreadable(path / "state.json", "datasets state file", e, fix=RESAVE) from e
        if not files or not all(f.is_file() for f in files):
            raise ZgError(
                f"{path}/state.json lists data files that are missing or none at all",
                key=KEY,
                fix=RESAVE,
            )
        for f in files:
            with pa.OSFile(str(f)) as stream:  # plain reads, not a memory map: resident memory stays one batch
                try:
                    reader = pa.ipc.open_stream(stream)
                except (pa.ArrowException, OSError) as e:
                    raise _unreadable(f, "datasets Arrow file", e, fix=RESAVE) from e
                cols = _columns(reader.schema.names, path, cfg)
                yield f, _guarded((b.select(cols) for b in reader), f, "datasets Arrow file", RESAVE)
    else:
        import lance

        try:
            ds = lance.dataset(str(path))
        except Exception as e:  # lance raises several types for a non-dataset
            raise _unreadable(path, "Lance dataset", e, fix="point corpus.source at a Lance dataset directory") from e
        cols = _columns(ds.schema.names, path, cfg)
        scan = ds.scanner(columns=cols, batch_size=BATCH_ROWS, scan_in_order=True).to_batches()
        yield (
            path,
            _guarded(scan, path, "Lance dataset", "restore it (a copy cut short?), or drop it from corpus.source"),
        )


def read_records(src: Source, cfg: CorpusConfig) -> Iterator[Doc]:
    """SRC's records as documents. A record without an id is ``STEM#N``, N its row in the whole source (from 0,
    across its files: a row number per file gave the first row of every file one id); messages name the file and
    its row there."""
    name = stem(src.path)
    n = 0
    for where, batches in _batches(src, cfg):
        row = 0
        for batch in batches:
            cols = {c: batch.column(c).to_pylist() for c in batch.schema.names}
            for i in range(batch.num_rows):
                yield record_doc({c: v[i] for c, v in cols.items()}, f"{where} row {row}", f"{name}#{n}", cfg)
                row, n = row + 1, n + 1

"""Reading API for training: a block's boundary pair, aligned by row, whole sequences.

Rows pair up by position in every boundary dataset (the token set's order); opening a
pair checks that by ``seq_id`` and checks that both sides share one lineage.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from zgdata.core import host_copy
from zgdata.core.timing import span
from zgdata.errors import ZgError, dvc_checkout
from zgdata.lineage import check
from zgdata.store.codec import BLOB_CODECS, codec_of, decode_rows, hidden_columns, value_info
from zgdata.store.integrity import (
    CHECKSUM_COLUMN,
    check_rows,
    checksum_of,
    digests,
    mismatched_rows,
    recover_fix,
    scan_checksums,
)
from zgdata.store.lance_io import open_dataset, rows_tensor, schema_meta
from zgdata.trust import dvc_lock as trust

__all__ = ["BoundaryDataset", "BoundaryPair", "epoch_order", "step_rows", "check_batch"]


class BoundaryDataset:
    """One complete boundary dataset, opened read-only."""

    def __init__(self, path: Path, *, version: int | None = None, recheck: bool = False):
        self.path, self.recheck = Path(path), recheck
        if version is None:  # the workspace's bytes: the ones dvc.lock (git) records, whatever a remote served
            trust.verify(self.path)
        self.ds = open_dataset(self.path, kind="boundary", version=version)
        self.meta = schema_meta(self.ds.schema)
        self.codec = codec_of(self.meta)
        self.checksum = checksum_of(self.meta)  # the row checksum's algorithm: blake2b before boundary format 4
        self.columns = hidden_columns(self.codec)
        self.field = self.ds.schema.field(self.columns[0])  # carries zg.dtype and zg.shape
        self.dtype, self.seq_len, self.hidden = value_info(self.ds.schema, self.meta)
        cols = self.ds.to_table(columns=["seq_id", "split"])
        self.seq_ids = cols.column("seq_id").to_numpy()
        self.splits = np.asarray(cols.column("split").to_pylist())
        expected = sum(self.meta.get("rows", {}).values())
        if len(self.seq_ids) != expected:
            raise ZgError(
                f"{self.path} has {len(self.seq_ids)} rows but its metadata promises {expected}",
                fix=recover_fix(self.path),
            )
        self._row_of = {int(s): i for i, s in enumerate(self.seq_ids)}
        self._verified = np.zeros(len(self.seq_ids), dtype=bool)  # rows whose checksum this object has checked
        self._pages, self._sums, self._split, self._planes = False, None, None, None
        self._np_dtype = np.uint16 if self.dtype == "bfloat16" else np.float32

    @property
    def name(self) -> str:
        return self.meta["name"]

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    def rows(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)

    @property
    def scan_columns(self) -> list[str]:
        """The value columns a streaming scan reads for ``decode`` (a blob boundary's rows come from its sidecars)."""
        return [] if self.codec in BLOB_CODECS else self.columns

    @property
    def _lo_bytes(self) -> int:
        """Bytes of one row's low bytes in a byte split: every byte of each value but its most significant."""
        return self.seq_len * self.hidden * (np.dtype(self._np_dtype).itemsize - 1)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's decoded values."""
        return self.seq_len * self.hidden * (2 if self.dtype == "bfloat16" else 4)

    def decode(self, table, rows=None, *, strict: bool = True, out=None, lo=None) -> np.ndarray:
        """(N, T*C) stored bits of a table read from this dataset; ``rows``: their row numbers, for the error;
        ``out``: an array to decode into, ``lo``: the low bytes already read (``codec.decode_rows``).
        A blob or zstd_blob boundary's table holds descriptors only: its rows are read from the sidecars (``rows``
        required; ``table`` is not read)."""
        if self.codec == "blob":
            values = self._page_reader()(np.asarray(rows, dtype=np.int64))
            if out is None:
                return values
            out[...] = values
            return out
        hi = None
        if self.codec == "zstd_blob":  # both planes from the mapped sidecars, as views
            hi_of, lo_of = self._blob_planes()
            rows = np.asarray(rows, dtype=np.int64)
            hi, lo = hi_of(rows), lo_of(rows)
        try:
            return decode_rows(
                table, self.codec, self.dtype, self.seq_len, self.hidden, strict=strict, out=out, lo=lo, hi=hi
            )
        except ValueError as e:
            where = f" (rows {int(np.min(rows))}-{int(np.max(rows))})" if rows is not None and len(rows) else ""
            raise ZgError(f"{self.path}{where}: {e}", fix=recover_fix(self.path)) from e

    def take(self, rows, *, check: bool = True) -> torch.Tensor:
        """(N, T, C) hidden states of the given row numbers, in the storage dtype (bf16 is a zero-copy view).

        Each row is checked against the checksum materialize wrote the first time this dataset object
        reads it (a ZgError names the first bad row; ``recheck=True`` at open checks on every read);
        ``check=False`` is for verify, which has already checked every row and reports instead.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self.seq_ids)):
            raise IndexError(f"row numbers must be in [0, {len(self.seq_ids)}) for {self.path}")
        order = np.argsort(rows, kind="stable")
        srt = rows[order]  # Lance (and the page maps) read sorted rows fastest; the caller's order is restored below
        need = check and (self.recheck or not self._verified[srt].all())
        with span("reader.take", rows=len(rows)) as sp:
            pages = self._page_reader()
            if pages is not None:  # mapped pages: read straight into the caller's order, one copy
                values = pages(rows)
                if need:
                    check_rows(self.path, self._checksums(rows), rows, self.seq_ids, values, algo=self.checksum)
            else:  # read and decode every time (no cache, or recheck): low bytes from their mapped pages
                values = self._decoder()(srt, None)
                if need:
                    check_rows(self.path, self._checksums(srt), srt, self.seq_ids, values, algo=self.checksum)
                if not np.array_equal(order, np.arange(len(rows))):
                    values = values[np.argsort(order)]
            if need:
                self._verified[srt] = True
            out = rows_tensor(values, self.dtype, self.seq_len, self.hidden)
            sp.nbytes = out.numel() * out.element_size()
        return out

    def scan(self, batch_bytes: int = 16 << 20) -> tuple[int, list[tuple[int, int]]]:
        """Every row against its checksum, about ``batch_bytes`` at a time, never cached (`zg data verify`): (rows
        checked, [(row, seq_id) of each row that fails]); a compressed row that does not decode is reported too.
        A raw boundary's rows are read through its mapped pages (2.3-3.2x Lance's streaming scan of the same rows,
        docs/results/write-path.md); other layouts stream through Lance (``integrity.scan_checksums``)."""
        pages = self._page_reader() if self.codec == "raw" else None
        if pages is None:
            return scan_checksums(
                self.ds,
                self.row_bytes,
                algo=self.checksum,
                columns=self.scan_columns,
                decode=lambda rb, rows: self.decode(rb, rows, strict=False),
                batch_bytes=batch_bytes,
            )
        n, step, bad = len(self.seq_ids), max(1, batch_bytes // self.row_bytes), []
        sums = self._checksums(np.arange(n))
        for start in range(0, n, step):
            rows = np.arange(start, min(n, start + step))
            bad += [
                (int(rows[i]), int(self.seq_ids[rows[i]]))
                for i in mismatched_rows(sums[rows], pages(rows), algo=self.checksum)
            ]
        return n, bad

    def _page_reader(self):
        """Mapped pages of a raw dataset (zgdata/store/pagemap.py), mapped sidecars of a blob one
        (zgdata/store/blobs.py), or the decoded-row cache of a compressed one (zgdata/store/decoded_cache.py), built
        on first use; None: read and decode every time (``_decoder``)."""
        if self._pages is False:
            self._pages = None
            read = self._decoder()  # sorted rows read and decoded: what the maps are probed against, the cache's fill
            fetch = lambda r: read(r, None)  # noqa: E731
            if self.codec == "blob":
                from zgdata.store.blobs import blob_reader

                self._pages = blob_reader(self.ds, self.path, self.seq_len * self.hidden, self._np_dtype)
            elif self.codec == "raw":
                from zgdata.store.pagemap import page_reader

                self._pages = page_reader(
                    self.ds, self.path, "hidden", self.seq_len * self.hidden, self._np_dtype, fetch
                )
            else:
                from zgdata.store.decode import pool_threads
                from zgdata.store.decoded_cache import decoded_cache

                self._pages = decoded_cache(
                    len(self.seq_ids),
                    self.seq_len * self.hidden,
                    self._np_dtype,
                    fetch,
                    fetch_into=read,
                    threads=max(1, pool_threads() // 2),  # a pair reads its two sides at once, each half the pool
                )
        if self.recheck and self.codec not in ("raw", "blob"):
            return None  # recheck: every read decodes from disk again and is checked (a cache would hide a later flip)
        return self._pages

    def _decoder(self):
        """``_split_reader``'s reader, built once: what the decoded cache fills from and what reads without it use."""
        if self._split is None:
            self._split = self._split_reader()
        return self._split

    def _split_reader(self):
        """(sorted rows, out or None) -> decoded rows of a compressed boundary. A byte-split codec's low bytes are
        a fixed-size list, flat in the pages like a raw boundary's values: they are read from the mapped pages, and
        Lance reads only the compressed high bytes (its take of the low bytes cost as much as decoding the high
        ones, bench/write_path.py). Any other codec or layout: Lance reads every value column."""
        if self.codec == "zstd_blob":  # both planes from the sidecars (``decode``)
            return lambda r, out: self.decode(None, r, out=out)
        lo_pages = None
        if self.columns == ["hidden_hi", "hidden_lo"]:
            from zgdata.store.pagemap import page_reader

            width = self._lo_bytes
            lo_pages = page_reader(self.ds, self.path, "hidden_lo", width, np.uint8, self._lo_probe(width))
        if lo_pages is None:
            return lambda r, out: self.decode(self.ds.take(r, columns=self.columns), r, out=out)
        views = lo_pages.views  # the low bytes are read in place by the decode: no copy, no fresh buffer
        return lambda r, out: self.decode(self.ds.take(r, columns=["hidden_hi"]), r, out=out, lo=views(r))

    def _blob_planes(self):
        """A ``zstd_blob`` boundary's (compressed high bytes, low bytes) readers: rows -> a view of each row's
        bytes in its mapped sidecar (zgdata/store/blobs.py), built once."""
        if self._planes is None:
            from zgdata.store.blobs import blob_rows

            self._planes = (
                blob_rows(self.ds, self.path, "hidden_hi"),
                blob_rows(self.ds, self.path, "hidden_lo", self._lo_bytes),
            )
        return self._planes

    def _lo_probe(self, width: int):
        """Lance's own read of some rows' low bytes: what the mapped pages must equal before they are used."""
        from zgdata.store.decode import flat_values

        return lambda r: flat_values(self.ds.take(r, columns=["hidden_lo"]).column("hidden_lo"), width)

    def _checksums(self, rows: np.ndarray) -> np.ndarray:
        """The stored checksums of ``rows``, (N, 16) uint8 (the column is read once, 16 bytes a row)."""
        if self._sums is None:
            self._sums = digests(self.ds.to_table(columns=[CHECKSUM_COLUMN]).column(CHECKSUM_COLUMN))
        return self._sums[rows]

    def by_seq_id(self, seq_ids) -> torch.Tensor:
        return self.take(rows_of_seq_ids(self._row_of, seq_ids, self.path))


def rows_of_seq_ids(row_of: dict, seq_ids, where) -> list[int]:
    """Row numbers of ``seq_ids`` in a boundary whose ``row_of`` maps seq_id -> row; ``where`` names it in errors."""
    try:
        return [row_of[int(s)] for s in seq_ids]
    except KeyError as e:
        raise ZgError(f"seq_id {e.args[0]} is not in {where}", fix="use seq_ids from data/tokens.lance") from e


def epoch_order(n: int, epoch: int, seed: int) -> torch.Tensor:
    """The permutation of ``n`` rows for ``epoch``: a pure function of (seed, epoch), so resume is exact."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return torch.randperm(n, generator=g)


def check_batch(batch_size: int, rows: int, key: str) -> None:
    """Refuse a batch of more sequences than the split has: each step would repeat rows within one batch, and an
    absurd value would fill memory before the first step."""
    if batch_size > rows:
        raise ZgError(
            f"{key} is {batch_size}, more than the {rows} training sequences there are",
            key=key,
            fix=f"set {key} to at most {rows}, or tokenize more text (corpus.max_train_seqs, a larger corpus)",
        )


def step_rows(rows: np.ndarray, step: int, batch_size: int, seed: int) -> np.ndarray:
    """Row numbers of training step ``step``: epochs of seeded permutations of ``rows``, concatenated."""
    n = len(rows)
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        order = epoch_order(n, epoch, seed)
        take = min(batch_size - len(out), n - offset)
        out.extend(rows[order[offset : offset + take].numpy()])
    return np.asarray(out)


class BoundaryPair:
    """The (input, target) boundaries of one block (paths, or boundaries already open: a virtual h00)."""

    def __init__(self, input_path, output_path):
        # both sides checked against dvc.lock in one call: their files hash at once, on as many cores
        trust.verify(*(Path(p) for p in (input_path, output_path) if not hasattr(p, "take")))
        self.input = input_path if hasattr(input_path, "take") else BoundaryDataset(input_path)
        self.output = output_path if hasattr(output_path, "take") else BoundaryDataset(output_path)
        self._pool = None
        check(
            self.input.name, self.input.meta.get("lineage", {}), self.output.name, self.output.meta.get("lineage", {})
        )
        if not np.array_equal(self.input.seq_ids, self.output.seq_ids):
            bad = (
                int(np.flatnonzero(self.input.seq_ids != self.output.seq_ids)[0])
                if len(self.input.seq_ids) == len(self.output.seq_ids)
                else min(len(self.input.seq_ids), len(self.output.seq_ids))
            )
            raise ZgError(
                f"{self.input.path} and {self.output.path} are not row-aligned (first difference at row {bad})",
                fix="re-run `dvc repro -f materialize` so both come from one pass",
            )
        if self.input.meta["lineage"]["layer"] >= self.output.meta["lineage"]["layer"]:
            raise ZgError(
                f"{self.input.name} (layer {self.input.meta['lineage']['layer']}) does not precede "
                f"{self.output.name} (layer {self.output.meta['lineage']['layer']})",
                fix="give the earlier boundary as the input and the later one as the target; in a pipeline (whose "
                "blocks.KEY.in/out follow partition.boundaries) a dataset's recorded layer disagrees with its name: "
                f"restore it with `{dvc_checkout(self.input.path, self.output.path)}`",
            )

    def rows(self, split: str) -> np.ndarray:
        return self.input.rows(split)

    def take(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides' rows; the target side is read in a second thread (copies and hashing release the GIL)."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="zg-pair")
        y = self._pool.submit(self.output.take, rows)
        return self.input.take(rows), y.result()

    def batch_rows(self, split: str, step: int, batch_size: int, seed: int) -> np.ndarray:
        rows = self.rows(split)
        if len(rows) == 0:
            raise ZgError(f"{self.input.path} has no '{split}' rows", fix="check corpus.heldout and the caps")
        return step_rows(rows, step, batch_size, seed)

    def batches(
        self,
        split: str,
        *,
        start_step: int,
        steps: int,
        batch_size: int,
        seed: int,
        prefetch: int = 2,
        device: torch.device | None = None,
    ) -> Iterator[tuple[int, np.ndarray, torch.Tensor, torch.Tensor]]:
        """Yield (step, rows, x, y) for steps [start_step, steps), loading ahead in a thread. A CUDA ``device``
        gets x and y from that thread too, copied while the step before runs (zgdata.core.host_copy.to_device);
        any other device gets them on the CPU."""
        q: queue.Queue = queue.Queue(maxsize=max(prefetch, 1))
        stop = threading.Event()
        if device is not None and device.type == "cuda" and device.index is None:  # the loading thread's own
            device = torch.device("cuda", torch.cuda.current_device())  # current device is GPU 0: name this one

        def work():
            try:
                for step in range(start_step, steps):
                    if stop.is_set():
                        return
                    rows = self.batch_rows(split, step, batch_size, seed)
                    q.put((step, rows, host_copy.to_device(self.take(rows), device)))
                q.put(None)
            except BaseException as e:  # re-raised in the consumer
                q.put(e)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while (item := q.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                step, rows, copy = item
                yield (step, rows, *copy.ready())
        finally:
            stop.set()
            while t.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    t.join(0.05)
            if device is not None and device.type == "cuda":
                host_copy.release(device)  # the pinned batches torch's host allocator cached for this run

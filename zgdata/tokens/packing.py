"""Packing token streams into ``seq_len`` rows as documents arrive, spilling rows to disk.

- ``eos``: documents are joined, each followed by EOS, and the stream is cut into
  ``seq_len`` windows; a long document runs across windows, and a row is named by the
  document its first token belongs to. The tail shorter than one row is dropped, or, for an
  evaluation set (``pad_tail``), kept as a last row padded on the right when it holds a next-token
  target (at least 2 tokens), its ``length`` counting the real ones.
- ``pad``: each document (followed by EOS) starts a new row; a document longer than a
  row continues in the next rows; the last row is padded with the pad token and the
  ``length`` column says how many tokens are real. Padding is on the right, so with
  causal attention no real position ever attends to a pad token; only losses and
  metrics need to skip positions ``>= length``. Rows with fewer than ``min_tokens``
  real tokens are dropped (and counted).

Rows go to an Arrow IPC stream file (``RowSpill``) in chunks, so memory holds at most
one chunk whatever the corpus size; tokenset.py then picks the kept rows from it.

A long document may arrive in parts (``add(..., first=, last=)``: its ids in order, EOS after
the last part): the rows are exactly those of the whole document added at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

__all__ = ["RowSpill", "EosPacker", "PadPacker", "FLUSH_TOKENS", "pack_eos_padded"]

FLUSH_TOKENS = 1 << 20  # tokens buffered before full rows are written out (~4 MB of int32)


class RowSpill:
    """Packed rows of one split, appended in chunks to an Arrow IPC stream file and read back in chunks."""

    def __init__(self, path: Path, seq_len: int, *, with_length: bool):
        fields = [pa.field("doc", pa.string()), pa.field("input_ids", pa.list_(pa.int32(), seq_len))]
        if with_length:
            fields.append(pa.field("length", pa.int32()))
        self.schema = pa.schema(fields)
        self.path, self.seq_len, self.rows, self.real_tokens = Path(path), seq_len, 0, 0
        self._sink = pa.OSFile(str(self.path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def write(self, rows: np.ndarray, docs: list[str], lengths: np.ndarray | None = None) -> None:
        if len(rows) == 0:
            return
        cols = [
            pa.array(docs, pa.string()),
            pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), pa.int32()), self.seq_len),
        ]
        if lengths is not None:
            cols.append(pa.array(lengths, pa.int32()))
        self._writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self.schema))
        self.rows += len(rows)
        self.real_tokens += int(lengths.sum()) if lengths is not None else rows.size

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows back, chunk by chunk (plain reads, not a memory map: resident memory stays one chunk)."""
        self.close()
        with pa.OSFile(str(self.path), "rb") as f:
            yield from pa.ipc.open_stream(f)


class EosPacker:
    """Documents joined with EOS, cut into ``seq_len`` rows (the whole-list packing, chunk by chunk)."""

    def __init__(self, spill: RowSpill, eos: int, *, flush_tokens: int = FLUSH_TOKENS, pad_tail: int | None = None):
        """``pad_tail``: the pad id of a kept, padded tail row (the spill then has a ``length`` column); None drops
        the tail."""
        self.spill, self.eos, self.flush_tokens, self.pad_tail = spill, eos, flush_tokens, pad_tail
        self.seq_len = spill.seq_len
        self._parts: list[np.ndarray] = []
        self._starts: list[int] = []  # offset of each buffered document's first token
        self._names: list[str] = []  # _names[0] may be a document that began in an earlier chunk
        self._n = 0
        self.dropped_tokens = 0

    def add(self, name: str, ids: np.ndarray, *, first: bool = True, last: bool = True) -> None:
        """A document's ids, or a part of them (``first``: its first part; ``last``: its last, EOS follows)."""
        if first or not self._starts:  # a continued document whose earlier rows were all written starts the buffer
            self._starts.append(self._n)
            self._names.append(name)
        part = ids.astype(np.int32, copy=False)
        self._parts.append(np.append(part, np.int32(self.eos)) if last else part)
        self._n += len(self._parts[-1])
        if self._n >= self.flush_tokens:
            self._flush()

    def _flush(self) -> None:
        t = self.seq_len
        flat = np.concatenate(self._parts) if len(self._parts) != 1 else self._parts[0]
        r = len(flat) // t
        if r:
            starts = np.asarray(self._starts)
            owner = np.searchsorted(starts, np.arange(r) * t, side="right") - 1  # doc holding each row's first token
            lengths = None if self.pad_tail is None else np.full(r, t, dtype=np.int32)
            self.spill.write(flat[: r * t].reshape(r, t), [self._names[i] for i in owner], lengths)
        rest = flat[r * t :]
        if len(rest):
            j = int(np.searchsorted(self._starts, r * t, side="right") - 1)
            self._starts = [0] + [s - r * t for s in self._starts[j + 1 :]]
            self._names = self._names[j:]
            self._parts, self._n = [rest.copy()], len(rest)
        else:
            self._starts, self._names, self._parts, self._n = [], [], [], 0

    def finish(self) -> RowSpill:
        if self._parts:
            self._flush()
        if self.pad_tail is not None and self._n >= 2:  # the tail holds a next-token target: a padded last row
            row = np.full((1, self.seq_len), self.pad_tail, dtype=np.int32)
            row[0, : self._n] = self._parts[0]
            self.spill.write(row, self._names[:1], np.array([self._n], dtype=np.int32))
            self._n = 0
        self.dropped_tokens = self._n  # the tail shorter than one row
        self._parts, self._starts, self._names, self._n = [], [], [], 0
        self.spill.close()
        return self.spill


class PadPacker:
    """Each document starts a row; its last row is padded; ``length`` counts the real tokens."""

    def __init__(self, spill: RowSpill, eos: int, pad: int, *, min_tokens: int, flush_tokens: int = FLUSH_TOKENS):
        self.spill, self.eos, self.pad, self.min_tokens = spill, eos, pad, max(2, min_tokens)
        self.seq_len, self.flush_rows = spill.seq_len, max(1, flush_tokens // spill.seq_len)
        self._rows: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._names: list[str] = []
        self._count = 0
        self._carry = np.empty(0, np.int32)  # a document in parts: its ids after its last whole row
        self.dropped_rows = 0
        self.dropped_tokens = 0

    def add(self, name: str, ids: np.ndarray, *, first: bool = True, last: bool = True) -> None:
        """A document's ids, or a part of them (``first``: its first part; ``last``: its last, EOS follows). A part
        before the last gives its whole rows now; the rest waits for the next part."""
        ids = ids.astype(np.int32, copy=False)
        if not first:
            ids = np.concatenate([self._carry, ids])
        if not last:
            whole = len(ids) // self.seq_len * self.seq_len
            self._carry = ids[whole:].copy()
            if whole:
                self._rows_of(name, ids[:whole], eos=False)
            return
        self._carry = np.empty(0, np.int32)
        self._rows_of(name, ids, eos=True)

    def _rows_of(self, name: str, ids: np.ndarray, *, eos: bool) -> None:
        """Rows of ``ids`` (+ EOS), starting a row: all full but the last, padded (no EOS: a multiple of seq_len)."""
        t, n = self.seq_len, len(ids) + eos
        r = -(-n // t)
        rows = np.full(r * t, self.pad, dtype=np.int32)
        rows[: len(ids)] = ids
        if eos:
            rows[n - 1] = self.eos
        lengths = np.full(r, t, dtype=np.int32)
        lengths[-1] = n - (r - 1) * t
        keep = lengths >= self.min_tokens
        self.dropped_rows += int((~keep).sum())
        self.dropped_tokens += int(lengths[~keep].sum())
        if keep.any():
            self._rows.append(rows.reshape(r, t)[keep])
            self._lengths.append(lengths[keep])
            self._names.extend([name] * int(keep.sum()))
            self._count += int(keep.sum())
        if self._count >= self.flush_rows:
            self._flush()

    def _flush(self) -> None:
        if self._count:
            self.spill.write(np.concatenate(self._rows), self._names, np.concatenate(self._lengths))
        self._rows, self._lengths, self._names, self._count = [], [], [], 0

    def finish(self) -> RowSpill:
        self._flush()
        self.spill.close()
        return self.spill


def pack_eos_padded(docs: Iterator[tuple[str, np.ndarray]], seq_len: int, eos: int, pad: int, folder: Path):
    """(rows, lengths) as int64 arrays: ``eos`` packing of (name, ids) documents with the tail kept padded
    (``EosPacker(pad_tail=pad)``), spilled under FOLDER and read back whole (an evaluation set: small)."""
    packer = EosPacker(RowSpill(Path(folder) / "rows.arrow", seq_len, with_length=True), eos, pad_tail=pad)
    for name, ids in docs:
        packer.add(name, ids)
    batches = list(packer.finish().batches())
    rows = [b.column("input_ids").values.to_numpy().reshape(-1, seq_len) for b in batches]
    lengths = [b.column("length").to_numpy() for b in batches]
    if not rows:
        return np.zeros((0, seq_len), dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows).astype(np.int64), np.concatenate(lengths).astype(np.int64)

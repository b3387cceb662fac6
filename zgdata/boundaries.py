"""Public reading API: a boundary dataset as torch tensors, for work outside zg (probes, SAEs, ...).

    from zgdata.boundaries import open_boundary
    b = open_boundary("data/boundaries/h05.lance")        # raw or zstd codec alike
    x = b.take([0, 7])                                     # (2, seq_len, hidden) torch.bfloat16
    rows = b.rows_dataset("train")                         # torch Dataset: one (seq_len, hidden) row each
    toks = b.tokens_dataset("train")                       # torch Dataset: one (hidden,) vector per token

A project's h00 under ``materialize.virtual_first: true`` is not stored: ``open_boundary`` of its
path (absent) computes it from data/tokens.lance and the head slice's embedding, bit-identical to a
stored one (``b.codec == "virtual"``; zgdata/materialize/virtual.py).

Every read of a stored boundary checks each row's checksum (a ZgError names a damaged row). Values are the stored
bits: bf16 boundaries come back as bf16 (``.float()`` for fp32 math). The datasets reopen the
Lance dataset lazily in each process, so they work with ``DataLoader(num_workers > 0)``: pass
``multiprocessing_context="spawn"`` (or ``"forkserver"``), since Lance is not fork-safe (a forked worker can
wait forever on a lock one of the parent's Lance threads held at the fork; a forked worker at least opens its
own handle). They define ``__getitems__``, so a DataLoader batch is one sorted Lance read, not one per item.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from zgdata.store.reader import BoundaryDataset

__all__ = ["open_boundary", "Boundary", "RowDataset", "TokenDataset"]


class Boundary:
    """One complete boundary dataset: metadata, row numbers per split, and rows as tensors."""

    def __init__(self, path, *, version: int | None = None):
        from zgdata.materialize.virtual import virtual_from_params

        # a project's h00 under materialize.virtual_first is not on disk: it is computed from tokens + embedding
        # (found from the path's project, so a relative path is made absolute first)
        absent = not Path(path).exists() and version is None
        vb = virtual_from_params(Path(path).absolute()) if absent else None
        self._b = vb if vb is not None else BoundaryDataset(Path(path), version=version)
        self.version = version

    name = property(lambda self: self._b.name)
    path = property(lambda self: self._b.path)
    layer = property(lambda self: self._b.meta["layer"])
    seq_len = property(lambda self: self._b.seq_len)
    hidden = property(lambda self: self._b.hidden)
    dtype = property(lambda self: self._b.dtype)  # the storage dtype: "bfloat16" or "float32"
    codec = property(lambda self: self._b.codec)
    fingerprint = property(lambda self: self._b.fingerprint)
    lineage = property(lambda self: dict(self._b.meta["lineage"]))
    seq_ids = property(lambda self: self._b.seq_ids)

    def __len__(self) -> int:
        return len(self._b.seq_ids)

    def rows(self, split: str | None = None) -> np.ndarray:
        """Row numbers of a split ("train", "heldout"), or of every row."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)} (or None: every row)")
        return np.arange(len(self)) if split is None else self._b.rows(split)

    def take(self, rows) -> torch.Tensor:
        """(N, seq_len, hidden) tensor of the given row numbers (integers, or a boolean mask over every row), in
        their order."""
        return self._b.take(_row_numbers(rows, len(self)))

    def rows_dataset(self, split: str | None = None) -> RowDataset:
        self.rows(split)  # an unknown split is refused here, not as an empty dataset
        return RowDataset(self._b.path, split, self.version)

    def tokens_dataset(self, split: str | None = None) -> TokenDataset:
        self.rows(split)
        return TokenDataset(self._b.path, split, self.version)


SPLITS = ("train", "heldout")


def _row_numbers(rows, n: int) -> np.ndarray:
    """Row numbers as int64: integers as given, a boolean mask of length ``n`` as the rows it selects (numpy's
    meaning); anything else (floats: a truncated 5.9 would read row 5) is refused."""
    r = np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows)
    if r.dtype == bool:
        if r.shape != (n,):
            raise IndexError(f"a boolean mask of shape {r.shape} over {n} rows")
        return np.flatnonzero(r)
    if r.size and not np.issubdtype(r.dtype, np.integer):
        raise TypeError(f"row numbers must be integers, not {r.dtype}")
    return r.astype(np.int64).reshape(-1)


def open_boundary(path, *, version: int | None = None) -> Boundary:
    """Open a boundary dataset written by ``zg data materialize`` (any codec, any Lance version)."""
    return Boundary(path, version=version)


class _Lazy(Dataset):
    """Holds a path; opens the boundary on first use in each process (Lance handles do not pickle)."""

    def __init__(self, path, split: str | None, version: int | None = None):
        self.path, self.split, self.version = Path(path), split, version
        self._open()

    def _open(self) -> None:
        self._b = Boundary(self.path, version=self.version)
        self._rows = self._b.rows(self.split)
        self._pid = os.getpid()

    def __getstate__(self):
        return {"path": self.path, "split": self.split, "version": self.version}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._b = None

    def _boundary(self) -> Boundary:
        if self._b is None or self._pid != os.getpid():  # unpickled, or inherited by a forked process
            self._open()
        return self._b


class RowDataset(_Lazy):
    """A torch Dataset over whole rows (sequences) of one split: item i is a (seq_len, hidden) tensor."""

    def __len__(self) -> int:
        self._boundary()
        return len(self._rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]

    def __getitems__(self, idx) -> list[torch.Tensor]:
        b = self._boundary()
        return list(b.take(self._rows[np.asarray(idx, dtype=np.int64)]).clone().unbind(0))


class TokenDataset(_Lazy):
    """A torch Dataset over token positions of one split: item i is the (hidden,) vector of token i
    (row ``i // seq_len`` of the split, position ``i % seq_len``)."""

    def __len__(self) -> int:
        b = self._boundary()  # reopens, and restores _rows, in a process that unpickled this dataset
        return len(self._rows) * b.seq_len

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]

    def __getitems__(self, idx) -> list[torch.Tensor]:
        b = self._boundary()
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"token index out of range [0, {len(self)})")
        row, pos = np.divmod(idx, b.seq_len)
        uniq, inv = np.unique(row, return_inverse=True)  # each needed row is read once
        x = b.take(self._rows[uniq])
        return list(x[torch.from_numpy(inv.reshape(-1)), torch.from_numpy(pos)].clone().unbind(0))

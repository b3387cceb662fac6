"""A zero-parse read path for raw boundaries: np.memmap views straight onto the Lance pages.

A raw boundary stores each row's values uncompressed, as one fixed-size list, so every page
of the value column of a Lance data file is just consecutive rows of raw bytes. Lance's own
``take`` decodes its way there at about a third of memory speed (bench/materialize.py); the
pages, mapped, read at memory speed. ``page_reader`` builds the maps from the files' own
metadata and accepts the layout only when every page is a whole number of rows covering the
fragment exactly and a probe of the first and last rows equals Lance's ``take``; anything
else (another encoding, a compressed codec, a future Lance layout) returns None and the
reader keeps using ``take``. Every read is still checked against the per-row checksums.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["page_reader"]


def page_reader(ds, path: Path, column: str, row_values: int, dtype, take_probe):
    """rows (int64, any order) -> (N, row_values) array read from mapped pages, or None if the layout is not flat.

    The reader's ``views(rows)`` gives the same rows as views onto the maps, a list of 1-D arrays, copying nothing."""
    try:
        from lance.file import LanceFileReader

        dtype = np.dtype(dtype)
        row_bytes = row_values * dtype.itemsize
        col = ds.schema.names.index(column)
        # one map per data file (a page per batch of rows is common: one map per page could run into the
        # kernel's limit on mappings); each page: its first row in the dataset, its file and byte offset
        files_, starts, offsets, which, n = [], [], [], [], 0
        for frag in ds.get_fragments():
            files = frag.data_files()
            if len(files) != 1 or frag.metadata.deletion_file is not None:
                return None
            fpath = str(Path(path) / "data" / files[0].path)
            rows_here = 0
            for page in LanceFileReader(fpath).metadata().columns[col].pages:
                if len(page.buffers) != 1 or page.buffers[0].size % row_bytes:
                    return None
                k = page.buffers[0].size // row_bytes
                if k:
                    starts.append(n + rows_here)
                    offsets.append(page.buffers[0].position)
                    which.append(len(files_))
                rows_here += k
            if rows_here != frag.count_rows():
                return None
            files_.append(np.memmap(fpath, dtype=np.uint8, mode="r").view(np.ndarray))  # slices: no memmap objects
            n += rows_here
        if n != ds.count_rows() or not starts:
            return None
        starts_a = np.asarray(starts, dtype=np.int64)
        offsets_a = np.asarray(offsets, dtype=np.int64)
        which_a = np.asarray(which, dtype=np.int64)

        def views(rows: np.ndarray) -> list[np.ndarray]:
            """Each row as a read-only view onto its mapped page (no copy)."""
            page = np.searchsorted(starts_a, rows, side="right") - 1
            at = offsets_a[page] + (np.asarray(rows, dtype=np.int64) - starts_a[page]) * row_bytes
            return [files_[f][o : o + row_bytes].view(dtype) for f, o in zip(which_a[page].tolist(), at.tolist())]

        def read(rows: np.ndarray) -> np.ndarray:
            out = np.empty((len(rows), row_values), dtype)
            for i, v in enumerate(views(rows)):
                out[i] = v
            return out

        read.views = views  # the decoders read a byte-split codec's low bytes in place (zgdata/store/codec.py)

        probe = np.unique([0, n // 2, n - 1])
        if not np.array_equal(read(probe), take_probe(probe)):
            return None
        return read
    except Exception:  # an optimisation only: any surprise keeps Lance's take
        return None

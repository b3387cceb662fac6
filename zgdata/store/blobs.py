"""Reading a ``blob`` or ``zstd_blob`` boundary: its rows' bytes straight from Lance's packed sidecar files, mapped.

Each row of a blob boundary is one value of a Lance blob v2 column (zgdata/store/codec.py): the data file
holds a descriptor per row (kind, position, size, blob id) and the bytes lie in a packed sidecar,
``data/<data file stem>/<blob file>``, rows one after another. ``blob_reader`` reads every descriptor once
(a few bytes a row), maps each sidecar, and then reads rows by slicing the maps: one copy a row, like a raw
boundary's mapped pages (zgdata/store/pagemap.py). It maps only when every row is packed, one row's bytes
long and inside its sidecar, and a probe of the first, middle and last rows equals Lance's own
``take_blobs``; otherwise (another Lance layout or file naming) every read goes through ``take_blobs``:
slower, the same bytes. Either way the caller checks each row against its checksum. ``blob_rows`` reads any blob
column, rows of any size (a ``zstd_blob`` boundary's compressed high bytes, and its low bytes), as views.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zgdata.store.integrity import is_read_error, read_error

__all__ = ["blob_reader", "blob_rows", "sidecar_dirs"]

PACKED = 1  # a blob descriptor's kind for bytes in a packed sidecar (Lance 14: 0 inline, 1 packed)


def sidecar_dirs(ds, path: Path) -> list[Path]:
    """Each data file's sidecar folder, ``data/<stem>/`` (where Lance keeps the blobs of that file)."""
    return [Path(path) / "data" / Path(d.path).stem for f in ds.get_fragments() for d in f.data_files()]


def _sidecar_name(folder: Path, blob_id: int) -> Path | None:
    """The sidecar file of ``blob_id``: Lance 14 names it by the id's 32 bits, least significant first; other
    versions by its hex digits. None when neither is there (the probe then leaves the read to Lance)."""
    for name in (format(blob_id, "032b")[::-1], f"{blob_id:08x}"):
        if (folder / f"{name}.blob").is_file():
            return folder / f"{name}.blob"
    return None


def _mapped(ds, path: Path, column: str, row_bytes: int | None):
    """(maps, file index per row, byte offset per row, bytes per row) when every row of blob column ``column`` is a
    packed blob (of ``row_bytes`` unless None) inside an existing sidecar; None otherwise."""
    maps, which, offsets, sizes = [], [], [], []
    for frag in ds.get_fragments():
        files = frag.data_files()
        if len(files) != 1 or frag.metadata.deletion_file is not None:
            return None
        d = frag.to_table(columns=[column]).column(column).combine_chunks()
        kind, size = d.field("kind").to_numpy(), d.field("size").to_numpy().astype(np.int64)
        if len(kind) and (np.any(kind != PACKED) or (row_bytes is not None and np.any(size != row_bytes))):
            return None
        pos, ids = d.field("position").to_numpy().astype(np.int64), d.field("blob_id").to_numpy()
        folder = Path(path) / "data" / Path(files[0].path).stem
        index = np.empty(len(ids), dtype=np.int64)
        for blob_id in np.unique(ids).tolist():
            f = _sidecar_name(folder, blob_id)
            at = ids == blob_id
            if f is None or f.stat().st_size < int((pos[at] + size[at]).max()):
                return None
            index[at] = len(maps)
            maps.append(np.memmap(f, dtype=np.uint8, mode="r").view(np.ndarray))  # slices: no memmap objects
        which.append(index)
        offsets.append(pos)
        sizes.append(size)
    if not maps:
        return None
    return maps, np.concatenate(which), np.concatenate(offsets), np.concatenate(sizes)


def blob_rows(ds, path: Path, column: str, row_bytes: int | None = None):
    """rows (int64, any order) -> each row's bytes in blob column ``column`` (uint8 arrays: views onto the mapped
    sidecars, or the bytes of Lance's ``take_blobs``); ``row_bytes``: the size every row must have, if any."""
    lance_ds = getattr(ds, "lance_dataset", ds)  # the guarded dataset's own: take_blobs is not a wrapped read

    def through_lance(rows: np.ndarray) -> list:
        if not len(rows):
            return []
        try:
            blobs = lance_ds.take_blobs(column, indices=np.asarray(rows, dtype=np.int64).tolist())
            if len(blobs) != len(rows):  # never return fewer rows than asked: a missing blob is a damaged row
                raise ValueError(f"{len(blobs)} blobs for {len(rows)} rows")
            out = []
            for b in blobs:
                with b:
                    raw = b.read()
                if row_bytes is not None and len(raw) != row_bytes:
                    raise ValueError(f"a blob of {len(raw)} bytes, not {row_bytes}")
                out.append(np.frombuffer(raw, dtype=np.uint8))
        except BaseException as e:
            if not is_read_error(e):
                raise
            raise read_error(Path(path), "boundary", e) from e
        return out

    try:
        layout = _mapped(ds, path, column, row_bytes)
    except Exception:  # noqa: BLE001 - an optimisation only: any surprise keeps Lance's read
        layout = None
    if layout is None:
        return through_lance
    maps, which, offsets, sizes = layout

    def read(rows: np.ndarray) -> list:
        rows = np.asarray(rows, dtype=np.int64)
        at = zip(which[rows].tolist(), offsets[rows].tolist(), sizes[rows].tolist())
        return [maps[f][o : o + n] for f, o, n in at]

    n = len(which)
    probe = np.unique([0, n // 2, n - 1])
    try:
        same = all(np.array_equal(a, b) for a, b in zip(read(probe), through_lance(probe), strict=True))
    except Exception:  # noqa: BLE001 - a probe that cannot run leaves the reads to Lance, which reports errors
        same = False
    return read if same else through_lance


def blob_reader(ds, path: Path, row_values: int, dtype):
    """rows (int64, any order) -> (N, row_values) array of a blob boundary's rows (mapped, or Lance's take_blobs)."""
    dtype = np.dtype(dtype)
    rows_of = blob_rows(ds, path, "hidden", row_values * dtype.itemsize)

    def read(rows: np.ndarray) -> np.ndarray:
        got = rows_of(rows)
        out = np.empty((len(got), row_values), dtype)
        for i, row in enumerate(got):
            out[i] = row.view(dtype)
        return out

    read.__name__ = rows_of.__name__  # "read" (the sidecars mapped) or "through_lance", as ``blob_rows`` chose
    return read

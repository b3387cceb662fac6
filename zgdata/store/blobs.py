"""Reading a ``blob`` boundary: its rows' bytes straight from Lance's packed sidecar files, mapped.

Each row of a blob boundary is one value of a Lance blob v2 column (zgdata/store/codec.py): the data file
holds a descriptor per row (kind, position, size, blob id) and the bytes lie in a packed sidecar,
``data/<data file stem>/<blob file>``, rows one after another. ``blob_reader`` reads every descriptor once
(a few bytes a row), maps each sidecar, and then reads rows by slicing the maps: one copy a row, like a raw
boundary's mapped pages (zgdata/store/pagemap.py). It maps only when every row is packed, one row's bytes
long and inside its sidecar, and a probe of the first, middle and last rows equals Lance's own
``take_blobs``; otherwise (another Lance layout or file naming) every read goes through ``take_blobs``:
slower, the same bytes. Either way the caller checks each row against its checksum.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zgdata.store.integrity import is_read_error, read_error

__all__ = ["blob_reader", "sidecar_dirs"]

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


def _mapped(ds, path: Path, row_bytes: int):
    """(maps, file index per row, byte offset per row) when every row is a packed blob of ``row_bytes`` inside an
    existing sidecar; None otherwise."""
    maps, which, offsets = [], [], []
    for frag in ds.get_fragments():
        files = frag.data_files()
        if len(files) != 1 or frag.metadata.deletion_file is not None:
            return None
        d = frag.to_table(columns=["hidden"]).column("hidden").combine_chunks()
        kind, size = d.field("kind").to_numpy(), d.field("size").to_numpy()
        if len(kind) and (np.any(kind != PACKED) or np.any(size != row_bytes)):
            return None
        pos, ids = d.field("position").to_numpy().astype(np.int64), d.field("blob_id").to_numpy()
        folder = Path(path) / "data" / Path(files[0].path).stem
        index = np.empty(len(ids), dtype=np.int64)
        for blob_id in np.unique(ids).tolist():
            f = _sidecar_name(folder, blob_id)
            at = ids == blob_id
            if f is None or f.stat().st_size < int(pos[at].max()) + row_bytes:
                return None
            index[at] = len(maps)
            maps.append(np.memmap(f, dtype=np.uint8, mode="r").view(np.ndarray))  # slices: no memmap objects
        which.append(index)
        offsets.append(pos)
    if not maps:
        return None
    return maps, np.concatenate(which), np.concatenate(offsets)


def blob_reader(ds, path: Path, row_values: int, dtype):
    """rows (int64, any order) -> (N, row_values) array of a blob boundary's rows (mapped, or Lance's take_blobs)."""
    dtype = np.dtype(dtype)
    row_bytes = row_values * dtype.itemsize
    lance_ds = getattr(ds, "lance_dataset", ds)  # the guarded dataset's own: take_blobs is not a wrapped read

    def through_lance(rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), row_values), dtype)
        if not len(rows):
            return out
        try:
            blobs = lance_ds.take_blobs("hidden", indices=np.asarray(rows, dtype=np.int64).tolist())
            if len(blobs) != len(rows):  # never leave rows of ``out`` unwritten: a missing blob is a damaged row
                raise ValueError(f"{len(blobs)} blobs for {len(rows)} rows")
            for i, b in enumerate(blobs):
                with b:
                    raw = b.read()
                if len(raw) != row_bytes:
                    raise ValueError(f"a blob of {len(raw)} bytes, not {row_bytes}")
                out[i] = np.frombuffer(raw, dtype=dtype)
        except BaseException as e:
            if not is_read_error(e):
                raise
            raise read_error(Path(path), "boundary", e) from e
        return out

    try:
        layout = _mapped(ds, path, row_bytes)
    except Exception:  # noqa: BLE001 - an optimisation only: any surprise keeps Lance's read
        layout = None
    if layout is None:
        return through_lance
    maps, which, offsets = layout

    def read(rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), row_values), dtype)
        for i, (f, o) in enumerate(zip(which[rows].tolist(), offsets[rows].tolist())):
            out[i] = maps[f][o : o + row_bytes].view(dtype)
        return out

    n = len(which)
    probe = np.unique([0, n // 2, n - 1])
    try:
        same = np.array_equal(read(probe), through_lance(probe))
    except Exception:  # noqa: BLE001 - a probe that cannot run leaves the reads to Lance, which reports errors
        same = False
    return read if same else through_lance

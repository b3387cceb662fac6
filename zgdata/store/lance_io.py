"""Thin, side-effect-explicit helpers over Lance: open with clear errors, metadata, tensors.

Hidden states are stored as one fixed-size list per sequence. Arrow has no bf16 type,
so bf16 is stored as its uint16 bit pattern, with field metadata naming the dtype and
shape; reads view those bits as ``torch.bfloat16`` without a copy.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from zgdata.errors import ZgError
from zgdata.store.integrity import check_format, guarded, recover_fix

if TYPE_CHECKING:  # torch loads where a tensor is made, not with this module (`zg data inspect` needs none)
    import torch

__all__ = [
    "open_dataset",
    "schema_meta",
    "encode_meta",
    "hidden_field",
    "tensor_column",
    "to_arrow_hidden",
    "dir_bytes",
    "STORAGE",
    "version_rows",
    "rows_tensor",
]

# storage dtype -> (arrow value type, name of the torch dtype of the bit pattern)
STORAGE = {"bfloat16": (pa.uint16(), "int16"), "float32": (pa.float32(), "float32")}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def open_dataset(path: Path, *, version: int | str | None = None, kind: str | None = None, require_complete=True):
    """Open a ZeroGraph Lance dataset, or raise a ZgError that says how to recover."""
    import lance

    path = Path(path)
    recover = recover_fix(path, kind)
    if version is not None and not isinstance(version, str) and (isinstance(version, bool) or version < 1):
        raise ZgError(f"{path} has no version {version}: versions count from 1", fix="list them with `zg data inspect`")
    if not path.exists():
        if path.suffix != ".lance":  # a name (h02), not a dataset's folder: restoring "h02" would not help
            near = path.with_name(path.name + ".lance")
            fix = (
                f"give the dataset's folder, {near}"
                if near.exists()
                else f"give a dataset's folder (a path ending in .lance, e.g. data/boundaries/{path.name}.lance)"
            )
            raise ZgError(f"dataset {path} does not exist", fix=fix)
        raise ZgError(f"dataset {path} does not exist", fix=recover)
    try:
        ds = lance.dataset(str(path), version=version)
        meta = schema_meta(ds.schema)
    except ValueError as e:
        if version is not None and "version" in str(e).lower():
            raise ZgError(f"{path} has no version {version}", fix="list versions with `zg data inspect`") from e
        raise ZgError(
            f"{path} is not a readable Lance dataset (corrupt or half-written): {str(e)[:160]}", fix=recover
        ) from e
    except Exception as e:  # lance raises OSError / RuntimeError / pyo3 panics for damaged files
        raise ZgError(
            f"{path} is not a readable Lance dataset (corrupt or half-written): {str(e)[:160]}", fix=recover
        ) from e
    # The manifest opens lazily: a data file it lists may be gone (deleted, partial checkout, broken link).
    missing = [d.path for f in ds.get_fragments() for d in f.data_files() if not (path / "data" / d.path).exists()]
    if not missing and isinstance(meta.get("codec"), dict) and meta["codec"].get("layout") == "blob":
        from zgdata.store.blobs import sidecar_dirs  # a blob boundary's bytes: a sidecar folder per data file

        missing = [f"{d.name}/" for d in sidecar_dirs(ds, path) if not d.is_dir() or not any(d.iterdir())]
    if missing:
        raise ZgError(
            f"{path} is corrupt: {len(missing)} data file(s) its manifest lists are missing (e.g. data/{missing[0]})",
            fix=recover,
        )
    if kind is not None and meta.get("kind") != kind:
        raise ZgError(f"{path} is not a ZeroGraph {kind} dataset (kind={meta.get('kind')!r})", fix=recover)
    if require_complete and meta.get("complete") is not True:
        raise ZgError(f"{path} is half-written: it was never marked complete", fix=recover)
    if require_complete and kind == "boundary":
        check_format(path, ds.schema, meta)
    # reads (take / to_table / to_batches) open data files lazily: their errors name the dataset too
    return guarded(ds, path, kind or meta.get("kind"))  # inspect opens without a kind: the advice still fits


def schema_meta(schema: pa.Schema) -> dict[str, Any]:
    """ZeroGraph's ``zg.*`` schema metadata, JSON values decoded."""
    out = {}
    for k, v in (schema.metadata or {}).items():
        k, v = k.decode(), v.decode()
        if k.startswith("zg."):
            try:
                out[k[3:]] = json.loads(v)
            except json.JSONDecodeError:
                out[k[3:]] = v
    return out


def encode_meta(meta: dict[str, Any]) -> dict[str, str]:
    return {f"zg.{k}": v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in meta.items()}


def hidden_field(name: str, seq_len: int, hidden: int, storage_dtype: str) -> pa.Field:
    value_type, _ = STORAGE[storage_dtype]
    return pa.field(
        name,
        pa.list_(value_type, seq_len * hidden),
        metadata={"zg.dtype": storage_dtype, "zg.shape": json.dumps([seq_len, hidden])},
    )


def to_arrow_hidden(x: torch.Tensor, storage_dtype: str) -> pa.FixedSizeListArray:
    """(B, T, C) tensor already in the storage dtype -> fixed-size list array of its bits."""
    import torch

    b = x.shape[0]
    flat = x.contiguous().reshape(-1)
    if storage_dtype == "bfloat16":
        values = pa.array(flat.view(torch.int16).numpy().view(np.uint16), type=pa.uint16())
    else:
        values = pa.array(flat.numpy(), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(values, flat.numel() // b)


def tensor_column(table: pa.Table, name: str, field: pa.Field) -> torch.Tensor:
    """(N, T, C) tensor of a hidden-state column. Zero-copy when the column is one chunk."""
    import torch

    dtype = field.metadata[b"zg.dtype"].decode()
    t, c = json.loads(field.metadata[b"zg.shape"])
    col = table.column(name)
    chunks = [ch.values.slice(ch.offset * ch.type.list_size, len(ch) * ch.type.list_size) for ch in col.chunks]
    arrs = [ch.to_numpy(zero_copy_only=True) for ch in chunks if len(ch)]
    arr = (
        arrs[0]
        if len(arrs) == 1
        else (np.concatenate(arrs) if arrs else np.zeros(0, STORAGE[dtype][0].to_pandas_dtype()))
    )
    with warnings.catch_warnings():  # arrow buffers are read-only; we never write through the view
        warnings.simplefilter("ignore", UserWarning)
        ten = torch.from_numpy(arr)
    if dtype == "bfloat16":
        ten = ten.view(torch.bfloat16)
    return ten.reshape(len(table), t, c)


def rows_tensor(values: np.ndarray, storage_dtype: str, seq_len: int, hidden: int) -> torch.Tensor:
    """(N, T, C) tensor of (N, T*C) stored bits, without a copy (bf16: a view of the uint16 bits)."""
    import torch

    arr = values if storage_dtype != "bfloat16" else values.view(np.int16)
    if arr.flags.writeable:  # the usual case (the reader's own copies): no warning to silence, and that costs
        ten = torch.from_numpy(arr)
    else:
        with warnings.catch_warnings():  # arrow buffers are read-only; we never write through the view
            warnings.simplefilter("ignore", UserWarning)
            ten = torch.from_numpy(arr)
    if storage_dtype == "bfloat16":
        ten = ten.view(torch.bfloat16)
    return ten.reshape(len(values), seq_len, hidden)


def version_rows(ds) -> list[dict]:
    """Lance versions with timestamp, row count and the commit's ZeroGraph message."""
    out = []
    for v in ds.versions():
        msg = ""
        try:
            tx = ds.read_transaction(v["version"])
            msg = (tx.transaction_properties or {}).get("zg.message", "") if tx else ""
        except Exception:  # old versions cleaned up: the version list stays useful without messages
            msg = ""
        out.append(
            {
                "version": v["version"],
                "timestamp": v["timestamp"].isoformat(timespec="seconds"),
                "rows": int(v["metadata"].get("total_rows", 0)),
                "message": msg,
            }
        )
    return out

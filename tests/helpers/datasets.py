"""The Lance datasets of a tiny project: the stored boundary bits and token rows, edits in place (schema metadata,
a new table version), a running materialize's progress, and a data file's digest less Lance's hash-ordered schema
buffer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lance
import pyarrow as pa
import torch

from zgdata.store.lance_io import encode_meta, open_dataset, schema_meta, tensor_column

__all__ = [
    "boundary_bits",
    "read_boundaries",
    "token_table",
    "set_schema_meta",
    "overwrite_table",
    "journal_rows",
    "data_file_digest",
]


def boundary_bits(root: Path) -> dict[str, dict]:
    """Every complete boundary dataset of ROOT: fingerprint, seq_ids and the stored bits (int16 view for bf16)."""
    out = {}
    for path in sorted((Path(root) / "data" / "boundaries").glob("*.lance")):
        ds = open_dataset(path, kind="boundary")
        table = ds.to_table()
        x = tensor_column(table, "hidden", ds.schema.field("hidden"))
        bits = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        out[path.stem] = {
            "fingerprint": schema_meta(ds.schema)["fingerprint"],
            "bits": bits.clone(),
            "seq_id": torch.from_numpy(table.column("seq_id").to_numpy().copy()),
            "dtype": x.dtype,
        }
    return out


def read_boundaries(root: Path, names) -> dict[str, tuple]:
    """Each named boundary of ROOT read through zg's reader, every row checked against its checksum: (the stored bits
    as int16, fingerprint, stats), whatever the codec."""
    import numpy as np

    from zgdata.layout import Layout
    from zgdata.store.reader import BoundaryDataset

    out = {}
    for n in names:
        b = BoundaryDataset(Layout(root).boundary(n), recheck=True)
        out[n] = (b.take(np.arange(len(b.seq_ids))).view(torch.int16).clone(), b.fingerprint, b.meta["stats"])
    return out


def token_table(layout) -> dict:
    """data/tokens.lance of a project (its ``Layout``): every column as a list, ``input_ids`` as a (rows, seq_len)
    array."""
    t = lance.dataset(str(layout.tokens)).to_table()
    out = {c: t.column(c).to_pylist() for c in t.schema.names if c != "input_ids"}
    out["input_ids"] = t.column("input_ids").combine_chunks().values.to_numpy().reshape(t.num_rows, -1)
    return out


def set_schema_meta(path: Path, **updates) -> None:
    """Change ``zg.*`` schema metadata of a Lance dataset in place (a new Lance version), JSON-encoded."""
    ds = lance.dataset(str(path))
    ds.update_schema_metadata(encode_meta(updates))


def overwrite_table(path: Path, table: pa.Table) -> int:
    """Write ``table`` as a new version of the dataset at ``path``, keeping its schema and metadata."""
    ds = lance.dataset(str(path))
    table = pa.Table.from_arrays(table.columns, schema=ds.schema)
    return lance.write_dataset(table, str(path), mode="overwrite").version


def journal_rows(root: Path) -> int:
    """Rows a running materialize has committed so far (its staging journal; 0 before the first commit)."""
    best = 0
    for j in (root / "data" / ".staging").glob("*/journal.json"):
        try:
            best = max(best, json.loads(j.read_text())["rows_done"])
        except (OSError, ValueError, KeyError):
            pass  # not written yet
    return best


def data_file_digest(path: Path) -> str:
    """sha256 of a Lance data file's bytes less its schema buffer (global buffer 0), whose metadata map Lance 14
    writes in hash order: two runs of the same write differ there only, in the order of the same keys (measured:
    every other byte is equal). Compare the schemas themselves (order-free) beside this digest."""
    import struct

    b = Path(path).read_bytes()
    if b[-4:] != b"LANC":
        raise AssertionError(f"{path} is not a Lance v2 data file")
    gbo_start, ngb = struct.unpack_from("<QI", b, len(b) - 40 + 16)
    pos, size = struct.unpack_from("<QQ", b, gbo_start) if ngb else (len(b), 0)
    return hashlib.sha256(b[:pos] + b[pos + size :]).hexdigest()


def kill_after_first_commit_then_resume(root: Path) -> int:
    """`zg data materialize` in ``root`` killed (-9) once a commit is journaled (each commit then sleeps 1 s), then run
    again to the end; returns the rows journaled before the kill, after checking the resume started from them."""
    import os
    import signal

    from tests.helpers.runners import kill_9_when, zg_main

    proc = kill_9_when(
        lambda: journal_rows(root) > 0,
        ["data", "materialize"],
        root,
        {**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_COMMIT": "1.0"},
        root.parent / "killed.stderr",
        "the first journaled commit",
    )
    done = journal_rows(root)
    assert proc.returncode == -signal.SIGKILL and 0 < done < 56
    res = zg_main("data", "materialize", "--json", cwd=root)
    assert json.loads(res.stdout)["resumed_from"] == done
    return done

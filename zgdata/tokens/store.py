"""The token set on disk: ``data/tokens.lance`` written from the packed spills (``write_tokens``: the kept rows,
train then heldout, numbered, written beside the path and renamed into place, then ``data/tokens.json``), opened
only when it is the token set tokens.json describes (``open_tokens``) and read by row (``read_tokens``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.core.atomic import atomic_path, write_json
from zgdata.errors import dvc_checkout
from zgdata.layout import Layout
from zgdata.store.lance_io import encode_meta, open_dataset, schema_meta
from zgdata.tokens.packing import RowSpill

__all__ = ["TokensResult", "write_tokens", "tokens_meta", "open_tokens", "read_tokens", "read_lengths", "real_targets"]


@dataclass(kw_only=True, frozen=True)
class TokensResult:
    path: Path
    fingerprint: str
    rows: dict
    tokens: dict
    documents: int = 0
    empty_documents: int = 0


def write_tokens(layout: Layout, cfg, fp: str, lineage: dict, spills: dict, keep: dict) -> TokensResult:
    """data/tokens.lance (``keep``: each split's kept rows of ``spills``, None for all) and data/tokens.json."""
    pad = cfg.packing == "pad"
    rows = {s: spills[s].rows if keep[s] is None else len(keep[s]) for s in spills}
    tokens = {s: int(rows[s] * cfg.seq_len) for s in spills}
    meta = {"kind": "tokens", "fingerprint": fp, "lineage": lineage, "rows": rows, "complete": True}
    fields = [
        pa.field("seq_id", pa.int64()),
        pa.field("split", pa.string()),
        pa.field("doc", pa.string()),
        pa.field("input_ids", pa.list_(pa.int32(), cfg.seq_len)),
    ]
    if pad:
        fields.append(pa.field("length", pa.int32()))
    schema = pa.schema(fields, metadata=encode_meta(meta))
    real = {}
    layout.tokens_json.unlink(missing_ok=True)  # until both are written, the pair is absent, never mismatched
    _write_atomic(
        pa.RecordBatchReader.from_batches(schema, _kept_rows(spills, keep, schema, real)),
        layout.tokens,
        message=f"tokens {fp[:12]}: {rows}",
    )
    if pad:
        lineage["packing"]["real_tokens"] = real
    write_json(layout.tokens_json, {"fingerprint": fp, "rows": rows, "tokens": tokens, "lineage": lineage})
    return TokensResult(
        path=layout.tokens,
        fingerprint=fp,
        rows=rows,
        tokens=tokens,
        documents=lineage["documents"],
        empty_documents=lineage.get("empty_documents", 0),
    )


def _kept_rows(spills: dict[str, RowSpill], keep: dict[str, np.ndarray | None], schema: pa.Schema, real: dict):
    """The final rows, batch by batch: train then heldout, each split's kept rows in order, numbered.
    ``real`` receives the kept rows' real (unpadded) tokens per split when rows carry a length."""
    seq_id = 0
    for split in ("train", "heldout"):
        real[split] = 0
        sel, start = keep[split], 0
        for b in spills[split].batches():
            if sel is not None:
                lo, hi = np.searchsorted(sel, [start, start + b.num_rows])
                idx, start = sel[lo:hi] - start, start + b.num_rows
                if len(idx) == 0:
                    continue
                b = b.take(pa.array(idx))
            n = b.num_rows
            if "length" in b.schema.names:
                real[split] += int(np.asarray(b.column("length")).sum())
            cols = [
                pa.array(np.arange(seq_id, seq_id + n, dtype=np.int64)),
                pa.array([split] * n, pa.string()),
                *b.columns,
            ]
            seq_id += n
            yield pa.RecordBatch.from_arrays(cols, schema=schema)


def _write_atomic(data, path: Path, *, message: str) -> None:
    """Write next to ``path`` and rename, so a crash never leaves a half-written dataset there."""
    import lance

    with atomic_path(path) as tmp:
        lance.write_dataset(data, str(tmp), mode="create", transaction_properties={"zg.message": message})


def tokens_meta(layout: Layout = Layout()) -> dict:
    """The token dataset's own ``zg.*`` metadata (its lineage record is data/tokens.json: zgdata.lineage)."""
    return schema_meta(open_tokens(layout).schema)


def open_tokens(layout: Layout = Layout()):
    """data/tokens.lance, checked to be the token set data/tokens.json describes."""
    from zgdata.lineage import check, read_tokens_json
    from zgdata.trust import dvc_lock as trust

    trust.verify(layout.tokens, layout.tokens_json)
    ds = open_dataset(layout.tokens, kind="tokens")
    check(
        str(layout.tokens_json),
        read_tokens_json(layout),
        str(layout.tokens),
        schema_meta(ds.schema),
        keys=("fingerprint",),
        fix=f"restore both from one commit (`{dvc_checkout('data/tokens.lance', 'data/tokens.json')}`) "
        "or re-run `dvc repro tokens`",
    )
    return ds


def read_tokens(
    layout: Layout, rows: np.ndarray | list[int] | None = None, *, ds=None
) -> tuple[torch.Tensor, list[str]]:
    """(N, T) int64 input ids and splits of the given row numbers (all rows if None)."""
    ds = ds if ds is not None else open_tokens(layout)
    table = (
        ds.to_table(columns=["input_ids", "split"])
        if rows is None
        else ds.take(np.asarray(rows, dtype=np.int64), columns=["input_ids", "split"])
    )
    col = table.column("input_ids").combine_chunks()
    ids = torch.from_numpy(col.values.to_numpy().astype(np.int64)).reshape(len(table), -1)
    return ids, table.column("split").to_pylist()


def read_lengths(layout: Layout, rows: np.ndarray | list[int], *, ds=None) -> torch.Tensor | None:
    """(N,) int64 real tokens of the given rows under ``corpus.packing: pad`` (positions at or past a row's length
    are padding, never scored); None when the token set has no ``length`` column (every position is real)."""
    ds = ds if ds is not None else open_tokens(layout)
    if "length" not in ds.schema.names:
        return None
    col = ds.take(np.asarray(rows, dtype=np.int64), columns=["length"]).column("length")
    return torch.from_numpy(np.asarray(col.to_pylist(), dtype=np.int64))


def real_targets(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(N, seq_len - 1) bool: which next-token targets (positions 1..) are real tokens of rows of ``lengths``."""
    return torch.arange(1, seq_len).unsqueeze(0) < lengths.unsqueeze(1)

"""The teacher pass over a range of rows, as materialize runs it in one process (writer.run_local) and in each
shard (shard_task): the token ids read batch by batch, each batch captured in forwards of ``materialize.batch_size``
rows (``capture_rows``), its boundaries handed on in row order. On a GPU batch i's boundaries copy to the host
while batch i+1's forward runs (zgdata/core/host_copy.py); on the CPU each batch is handed on as soon as it is
captured."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from zgdata.core import host_copy
from zgdata.core.timing import span
from zgdata.families.capture import capture_rows
from zgdata.layout import Layout
from zgdata.tokens.store import open_tokens, read_tokens

__all__ = ["captured"]


def captured(
    model, layout: Layout, *, lo: int, hi: int, batch_size: int, layers: list[int], storage: torch.dtype
) -> Iterator[tuple[np.ndarray, list, dict[int, torch.Tensor]]]:
    """(rows, splits, {layer: boundary on the CPU}) for each batch of rows [lo, hi), in row order. Spans:
    materialize.read_tokens, materialize.capture (on a GPU the forward's launch, not its run) and
    materialize.to_host (the wait for a GPU's copies)."""
    tokens = open_tokens(layout)

    def batches():
        for b in range(lo, hi, batch_size):
            rows = np.arange(b, min(b + batch_size, hi))
            with span("materialize.read_tokens", rows=len(rows)):
                ids, splits = read_tokens(layout, rows, ds=tokens)
            yield rows, splits, ids

    def launch(batch):
        rows, _, ids = batch
        with span("materialize.capture", rows=len(rows)):
            caps = capture_rows(model, ids, layers, storage_dtype=storage, rows=batch_size, on_device=True)
        return host_copy.to_host(caps)

    for (rows, splits, _), caps in host_copy.one_ahead(batches(), launch, wait_span="materialize.to_host"):
        yield rows, splits, caps

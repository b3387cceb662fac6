"""Where a block's (input, target) pairs come from: the stored boundaries, or a live teacher.

Both return the same tensors in the storage dtype (under a quantized codec, the online path
quantizes and dequantizes as the stored path does), so training is bitwise identical either way (the guarantee `--targets online` exists to prove).
"""

from __future__ import annotations

import numpy as np
import torch

from zgdata.config import BlockSpec, MaterializeConfig, PartitionConfig
from zgdata.layout import Layout
from zgdata.lineage import boundary_fingerprint, expected_lineages
from zgdata.store.quant import roundtrip_tensor
from zgdata.store.reader import BoundaryPair, step_rows

__all__ = ["CachedTargets", "OnlineTargets", "open_targets"]


class CachedTargets:
    kind = "cached"

    def __init__(self, layout: Layout, spec: BlockSpec, partition: PartitionConfig, mcfg: MaterializeConfig):
        from zgdata.materialize.virtual import open_pair_in

        # h00 may be virtual (materialize.virtual_first)
        self.pair = BoundaryPair(*open_pair_in(layout, spec, partition, mcfg))
        self.lineage = self.pair.input.meta["lineage"]
        self.fingerprints = {spec.input: self.pair.input.fingerprint, spec.output: self.pair.output.fingerprint}

    def rows(self, split: str) -> np.ndarray:
        return self.pair.rows(split)

    def batch_rows(self, split, step, batch_size, seed) -> np.ndarray:
        return self.pair.batch_rows(split, step, batch_size, seed)

    def take(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pair.take(rows)

    def batches(self, split, *, start_step, steps, batch_size, seed, device=None):
        """(step, rows, x, y); on a CUDA ``device`` already there, copied while the step before ran."""
        yield from self.pair.batches(
            split, start_step=start_step, steps=steps, batch_size=batch_size, seed=seed, device=device
        )


class OnlineTargets:
    """Recompute the pair from data/tokens.lance with the teacher (layers up to the block's output)."""

    kind = "online"

    def __init__(self, layout: Layout, spec: BlockSpec, partition: PartitionConfig, mcfg: MaterializeConfig):
        from zgdata.teacher.prepare import load_teacher
        from zgdata.tokens.store import open_tokens

        self.layout = layout
        self.tokens = open_tokens(layout)
        self.layers = (partition.layer_of(spec.input), partition.layer_of(spec.output))
        lin = expected_lineages(layout, partition, mcfg, (spec.input, spec.output))
        self.lineage = lin[spec.input]
        self.fingerprints = {n: boundary_fingerprint(v) for n, v in lin.items()}
        self.model, _ = load_teacher(layout, dtype=mcfg.compute_dtype, with_tokenizer=False, per_layer=True)
        self.storage = getattr(torch, mcfg.storage_dtype)
        self.codec = mcfg.codec
        self.batch = mcfg.batch_size
        self.splits = np.asarray(self.tokens.to_table(columns=["split"]).column("split").to_pylist())

    def rows(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)

    def batch_rows(self, split, step, batch_size, seed) -> np.ndarray:
        return step_rows(self.rows(split), step, batch_size, seed)

    def take(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The pair of ``rows`` on the CPU, as a cached pair's ``take`` gives it (the importance sample and the
        held-out loss read through here)."""
        return self._recompute(rows, on_device=False)

    def _recompute(self, rows, *, on_device: bool) -> tuple[torch.Tensor, torch.Tensor]:
        from zgdata.families.capture import capture_rows
        from zgdata.tokens.store import read_tokens

        ids, _ = read_tokens(self.layout, rows, ds=self.tokens)
        # in forwards of materialize.batch_size rows, as materialize ran them (zgdata.families.capture.capture_rows)
        caps = capture_rows(
            self.model, ids, list(self.layers), storage_dtype=self.storage, rows=self.batch, on_device=on_device
        )
        # a quantized codec: the same quantize + dequantize as the stored path (zgdata/store/quant.py)
        return tuple(roundtrip_tensor(caps[x], self.codec) for x in self.layers)

    def batches(self, split, *, start_step, steps, batch_size, seed, device=None):
        """(step, rows, x, y) on the teacher's device, where the block trains (``device`` is not used: the teacher
        recomputes each batch in this thread); on a GPU without a copy to the host and back (lossless codecs; a
        quantized one round-trips through the CPU, zgdata/store/quant.py)."""
        for step in range(start_step, steps):
            rows = self.batch_rows(split, step, batch_size, seed)
            yield (step, rows, *self._recompute(rows, on_device=True))


def open_targets(kind: str, layout: Layout, spec: BlockSpec, partition: PartitionConfig, mcfg: MaterializeConfig):
    return (
        CachedTargets(layout, spec, partition, mcfg)
        if kind == "cached"
        else OnlineTargets(layout, spec, partition, mcfg)
    )

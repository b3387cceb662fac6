"""A virtual first boundary: h00 recomputed from the token ids and the teacher's embedding, never stored.

Boundary 0 is only an embedding lookup of the tokens (GPT-2: plus learned positions). With
``materialize.virtual_first: true`` materialize does not write it; every reader gets it from
``data/tokens.lance`` and the head slice (``models/teacher/blocks/head.safetensors``) instead,
through the same calls a stored boundary answers (``take``, ``rows``, ``seq_ids``, ``meta``).

Bit-identical to the stored value: zgdata.families.capture computes ``fam.embed(inner, ids).to(compute)``
with the embedding modules in the compute dtype (a wider one by widening, exact; a narrower one
by the loader's cast, the same ``.to``) and stores ``.to(storage_dtype)``. Here the head slice's
embedding tensors (the same values as models/teacher/hf, cut from one model by teacher prepare)
are cast to the compute dtype and the family's ``embed_head`` does the same lookup (and add).

Lineage: the stored h00's lineage plus ``virtual: true``, the files it is computed from and the
digest of the embedding tensors; the fingerprint hashes the same keys as a stored h00's, so it is
the same fingerprint (the values are the same) and the blocks' identities do not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from zgdata.config import MaterializeConfig, PartitionConfig
from zgdata.layout import Layout

if TYPE_CHECKING:  # torch loads with a virtual boundary, not with this module (`zg data inspect` of a stored h00)
    import torch

__all__ = ["is_virtual", "stored", "VirtualBoundary", "open_boundary_in", "open_pair_in", "virtual_from_params"]


def is_virtual(name: str, partition: PartitionConfig, mcfg: MaterializeConfig) -> bool:
    """Is boundary ``name`` computed rather than stored (materialize.virtual_first and layer 0)?"""
    return bool(mcfg.virtual_first) and partition.layer_of(name) == 0


def stored(partition: PartitionConfig, mcfg: MaterializeConfig) -> tuple[list[str], list[int]]:
    """(names, layers) of the boundaries materialize writes."""
    keep = [(n, x) for n, x in zip(partition.names, partition.boundaries) if not is_virtual(n, partition, mcfg)]
    return [n for n, _ in keep], [x for _, x in keep]


class _Seen(dict):
    """A dict that records which keys were read: the tensors ``embed_head`` uses, whatever the family."""

    def __init__(self, *a):
        super().__init__(*a)
        self.used: set[str] = set()

    def __getitem__(self, k):
        self.used.add(k)
        return super().__getitem__(k)


class VirtualBoundary:
    """Boundary 0 of the project at ``layout``, computed on read; reads like a zgdata.store.reader.BoundaryDataset."""

    codec = "virtual"
    ds = None  # no Lance dataset behind it
    recheck = False

    def __init__(self, layout: Layout, mcfg: MaterializeConfig, name: str = "h00"):
        import torch

        from zgdata.core.hashing import tensors_sha256
        from zgdata.families.registry import family_of
        from zgdata.lineage import boundary_fingerprint
        from zgdata.store.lance_io import open_dataset, schema_meta
        from zgdata.teacher.prepare import load_slice

        self.layout, self.path = layout, layout.boundary(name)  # where a stored one would be (for messages)
        head, hmeta = load_slice(layout.teacher_head)
        self._fam = family_of(hmeta["config"])
        seen = _Seen(head)
        self._fam.embed_head(seen, torch.zeros(1, 1, dtype=torch.long))  # which tensors the lookup reads
        compute = getattr(torch, mcfg.compute_dtype)
        self._emb = {k: head[k].to(compute) for k in sorted(seen.used)}
        self._compute, self._storage = compute, getattr(torch, mcfg.storage_dtype)
        # the token set itself, not tokens.json: train@b00 depends on tokens.lance and the head slice only
        self.tokens = open_dataset(layout.tokens, kind="tokens")
        tmeta = schema_meta(self.tokens.schema)
        tlin = tmeta.get("lineage", {})
        cols = self.tokens.to_table(columns=["seq_id", "split"])
        self.seq_ids = cols.column("seq_id").to_numpy()
        self.splits = np.asarray(cols.column("split").to_pylist())
        self.seq_len, self.hidden = int(tlin["seq_len"]), int(hmeta["config"]["hidden_size"])
        self.dtype = mcfg.storage_dtype
        from zgdata.families.capture import CAPTURE_VERSION
        from zgdata.lineage import codec_lineage

        self.quant = mcfg.codec

        lineage = {
            "teacher_sha256": hmeta.get("teacher_sha256"),
            "tokenizer_sha256": tlin.get("tokenizer_sha256"),
            "tokens_fingerprint": tmeta.get("fingerprint"),
            "layer": 0,
            "storage_dtype": mcfg.storage_dtype,
            "compute_dtype": mcfg.compute_dtype,
            "attn_implementation": self._fam.attn_implementation,  # as boundary_lineage records it
            "capture_version": CAPTURE_VERSION,
            **codec_lineage(mcfg),  # a quantized codec applies to the computed h00 too, as to every boundary
            "virtual": True,
            "computed_from": [str(Layout(Path("")).tokens), str(Layout(Path("")).teacher_head)],
            "embedding_sha256": tensors_sha256({k: head[k] for k in sorted(seen.used)}),
        }
        self.meta = {
            "kind": "boundary",
            "name": name,
            "layer": 0,
            "fingerprint": boundary_fingerprint(lineage),
            "lineage": lineage,
            "seq_len": self.seq_len,
            "hidden": self.hidden,
            "rows": {str(k): int(v) for k, v in zip(*np.unique(self.splits, return_counts=True))},
            "codec": "virtual",
            "virtual": True,
            "complete": True,
        }
        self._row_of = {int(s): i for i, s in enumerate(self.seq_ids)}

    name = property(lambda self: self.meta["name"])
    fingerprint = property(lambda self: self.meta["fingerprint"])

    def rows(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)

    @property
    def row_bytes(self) -> int:
        return self.seq_len * self.hidden * (2 if self.dtype == "bfloat16" else 4)

    def take(self, rows, *, check: bool = True) -> torch.Tensor:
        """(N, T, C) boundary 0 of the given row numbers, in the storage dtype, in their order."""
        import torch

        from zgdata.core.timing import span
        from zgdata.store.quant import roundtrip_tensor
        from zgdata.tokens.store import read_tokens

        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self.seq_ids)):
            raise IndexError(f"row numbers must be in [0, {len(self.seq_ids)}) for {self.path} (virtual)")
        order = np.argsort(rows, kind="stable")
        with span("reader.take_virtual", rows=len(rows)) as sp:
            ids, _ = read_tokens(self.layout, rows[order], ds=self.tokens)
            with torch.no_grad():  # as zgdata.families.capture: the lookup in the compute dtype, then the storage cast
                h = self._fam.embed_head(self._emb, ids).to(self._compute).to(self._storage)
            h = roundtrip_tensor(h, self.quant)  # a quantized codec: the values a stored h00 would hold
            out = h[torch.from_numpy(np.argsort(order))] if len(rows) else h
            sp.nbytes = out.numel() * out.element_size()
        return out

    def by_seq_id(self, seq_ids) -> torch.Tensor:
        from zgdata.store.reader import rows_of_seq_ids

        return self.take(rows_of_seq_ids(self._row_of, seq_ids, self.layout.tokens))


def open_boundary_in(layout: Layout, name: str, partition: PartitionConfig, mcfg: MaterializeConfig):
    """The boundary ``name`` of the project at ``layout``: a VirtualBoundary or the stored BoundaryDataset."""
    if is_virtual(name, partition, mcfg):
        return VirtualBoundary(layout, mcfg, name)
    from zgdata.store.reader import BoundaryDataset

    return BoundaryDataset(layout.boundary(name))


def open_pair_in(layout: Layout, spec, partition: PartitionConfig, mcfg: MaterializeConfig) -> tuple:
    """Block ``spec``'s (input, output) boundaries, each virtual or stored as ``open_boundary_in`` decides."""
    return tuple(open_boundary_in(layout, n, partition, mcfg) for n in (spec.input, spec.output))


def virtual_from_params(path: Path):
    """A VirtualBoundary for ``ROOT/data/boundaries/hNN.lance`` when ROOT/params.yaml makes hNN virtual, else None."""
    from zgdata.config import load_params, section

    path = Path(path)
    root = path.parent.parent.parent
    if path.suffix != ".lance" or path.parent.name != "boundaries" or not (root / "params.yaml").is_file():
        return None
    p = load_params(root / "params.yaml")
    if "partition" not in p:
        return None
    part, mcfg = section(p, PartitionConfig, "partition"), section(p, MaterializeConfig, "materialize")
    if path.stem not in part.names or not is_virtual(path.stem, part, mcfg):
        return None
    return VirtualBoundary(Layout(root), mcfg, path.stem)

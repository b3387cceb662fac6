"""A mix of corpora: several sources, each with a weight and its own held-out rule, in one token set.

``corpus.source`` as a list of mappings (zgdata.config.MixPart: each source's keys, the corpus's where it gives
none) is tokenized source by source, each into its own spilled rows, so no row holds two sources. Then:

- **train rows**: ``shares`` splits ``corpus.max_train_seqs`` over the sources by weight (largest remainder), and
  each source's rows are a seeded sample of its own (``corpus.seed``). With no cap, the mix is as large as the
  scarcest source allows. A source with too few rows for its share is an error, never a silent repeat. A source of
  weight 0 gives no train row: it can still give held-out documents (the plays held out while training on
  sampled text alone).
- **held-out rows**: every source's held-out rows, in source order, then the same seeded cap as a plain corpus.
  A held-out document stays held out: its rows go nowhere but the heldout split. With only one source holding
  documents out, the heldout split is the one that source alone would give, so eval numbers stay comparable.

The token set's fingerprint covers each source's corpus digest, split rule, weight and row count; tokens.json's
lineage lists the sources (``mix``) and, for ``teacher:sample``, the sample's fingerprint and teacher digest,
which must be the prepared teacher's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence

import numpy as np

from zgdata.config import SAMPLE_SOURCE
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = ["shares", "Chain", "chained", "sample_lineage"]


def shares(weights: Sequence[float], rows: Sequence[int], cap: int, names: Sequence[str]) -> list[int]:
    """Train rows each source gives: ``cap`` (0: as many as the scarcest weighted source allows) split by weight,
    largest remainder first (ties: the earlier source). A source with fewer rows than its share is an error."""
    total = float(sum(weights))
    frac = [w / total for w in weights]
    if cap == 0:
        cap = min(math.floor(r / f + 1e-9) for r, f in zip(rows, frac, strict=True) if f > 0)
    exact = [cap * f for f in frac]
    out = [math.floor(x + 1e-9) for x in exact]
    order = sorted(range(len(out)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: cap - sum(out)]:
        out[i] += 1
    for n, r, name in zip(out, rows, names, strict=True):
        if n > r:
            raise ZgError(
                f"corpus source {name} has {r} train sequences but its weight asks for {n} of {cap}",
                key="corpus.max_train_seqs",
                fix="lower corpus.max_train_seqs or that source's weight, or give it more text "
                "(teacher:sample: corpus.sample.documents)",
            )
    return out


class Chain:
    """Several sources' spilled rows of one split read as one: ``rows`` and ``batches()`` like a RowSpill."""

    def __init__(self, spills: Sequence):
        self.spills = list(spills)
        self.rows = sum(s.rows for s in self.spills)

    def batches(self) -> Iterator:
        for s in self.spills:
            yield from s.batches()


def chained(rows: Sequence[int], kept: Sequence[np.ndarray | None]) -> np.ndarray:
    """Sorted row numbers in the chain of sources: each source's kept rows (None: all) after the rows before it."""
    out, start = [], 0
    for n, k in zip(rows, kept, strict=True):
        out.append(start + (np.arange(n, dtype=np.int64) if k is None else np.asarray(k, dtype=np.int64)))
        start += n
    return np.concatenate(out) if out else np.empty(0, np.int64)


def sample_lineage(layout: Layout, teacher: dict) -> dict:
    """data/sample.json's fingerprint and teacher, checked to be the prepared teacher's (a sample of another
    teacher is not this teacher's distribution)."""
    try:
        rec = json.loads(layout.sample_json.read_text())
        fp, sampled = rec["fingerprint"], rec["lineage"]["teacher_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ZgError(
            f"{layout.sample_json} is missing or unreadable ({type(e).__name__})",
            key="corpus.source",
            fix=f"re-run the sample stage: `dvc repro sample` (or `zg data sample`) for {SAMPLE_SOURCE}",
        ) from e
    if sampled != teacher["weights_sha256"]:
        raise ZgError(
            f"{layout.sample_jsonl} was sampled from teacher weights {sampled[:12]}, but the prepared teacher is "
            f"{teacher['weights_sha256'][:12]}",
            key="corpus.source",
            fix="sample again from this teacher: `dvc repro sample` (or `zg data sample`)",
        )
    return {"fingerprint": fp, "teacher_sha256": sampled}

"""One boundary batch's encoding (zgdata/materialize/encode.py ``encode_batch``) with a quantized codec."""

from __future__ import annotations

import numpy as np
import torch

from zgdata.materialize.encode import encode_batch
from zgdata.materialize.staging import boundary_schema
from zgdata.materialize.stats import batch_stats
from zgdata.store.quant import roundtrip_tensor

STAT_KEYS = ("rms_units", "tokens", "absmax", "nonfinite")


def test_quantized_stats_describe_the_stored_values_not_the_teachers():
    """With int8 the boundary holds the round-tripped values, not the teacher's: its recorded stats (RMS, absmax)
    must be those of what a reader gets back, i.e. ``batch_stats(roundtrip_tensor(x, "int8"))``. Channels with scales
    from 0.01 to 50 make the quantization error visible in the stats, so they differ from x's own."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 8, 64, generator=g) * torch.linspace(0.01, 50, 64)).to(torch.bfloat16)
    enc = encode_batch(
        x,
        np.array([0, 1]),
        ["train", "train"],
        schema=boundary_schema(None, 8, 64, "bfloat16", "int8"),
        storage_dtype="bfloat16",
        codec="int8",
        checksum="xxh3_128",
    )
    stored, teacher = batch_stats(roundtrip_tensor(x, "int8")), batch_stats(x)
    assert {k: enc.stats[k] for k in STAT_KEYS} == {k: stored[k] for k in STAT_KEYS}
    assert {k: stored[k] for k in STAT_KEYS} != {k: teacher[k] for k in STAT_KEYS}  # the test is not vacuous

"""Per-boundary summary statistics (mean token RMS, absmax), exact and independent of order.

A boundary's ``mean_rms`` is the mean over its tokens of each token's RMS (computed in
float32 from the stored values), and ``absmax`` the largest stored absolute value. The sum
behind the mean is kept exactly, as an integer count of 2**-149 (the smallest float32
step): every float32 is a whole multiple of it. The stats therefore do not depend on how
the rows were grouped (commit groups, shards of a data-parallel run, a resume part way
through) nor on the order in which the parts are added, and the mean is rounded once at
the end. A float64 running sum would depend on all of these, so two correct runs of the
same data could disagree in the last bits.

A part's stats are a JSON-able dict (journals and shard results carry them):
``{"rms_units": int, "tokens": int, "absmax": float, "nonfinite": int}``. Non-finite
token RMS values (a teacher that overflows) are counted, not summed: they would make the
sum meaningless and their max would depend on order.

Under a quantized codec (zgdata/store/quant.py) a part also carries the reconstruction error:
``qerr``/``qsig``, per channel, the sums of (x - x')^2 and x^2 over its tokens. Each batch's float64 sums
(the same rows per batch however the run is split) are kept as whole multiples of 2**-60, so combining parts
is exact integer addition, in any order; ``summary`` reports the relative RMS error and the worst channel's.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

__all__ = ["empty", "batch_stats", "error_stats", "combine", "summary"]

_ERR_EXP = 60  # error sums are kept in units of 2**-60

_UNIT_EXP = 149  # float32 values are whole multiples of 2**-149


def empty() -> dict:
    return {"rms_units": 0, "tokens": 0, "absmax": 0.0, "nonfinite": 0}


def _units(v: np.ndarray) -> int:
    """Exact sum of non-negative finite float32 values, in units of 2**-149."""
    bits = v.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) & 0xFF
    mant = np.where(exp > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    shift = np.maximum(exp, 1) - 1  # value = mant * 2**(max(exp, 1) - 150) = mant * 2**shift units
    if not len(v):
        return 0
    if len(v) < 2**28:  # each exponent's mantissa sum < 2**24 * 2**28 = 2**52: exact in bincount's float64
        sums = np.bincount(shift, weights=mant)  # one pass, no mask per exponent (its Python holds the GIL)
        return sum(int(sums[s]) << int(s) for s in np.flatnonzero(sums))
    total = 0
    for s in np.unique(shift):  # at most 254 exponents; each group's mantissa sum fits int64 (< 2**24 each)
        total += int(mant[shift == s].sum()) << int(s)
    return total


_SCRATCH = threading.local()


def _row_buffer(shape: torch.Size) -> torch.Tensor:
    """This thread's float32 buffer of one row's shape, reused for every row it takes stats of.

    A fresh float32 copy per row (1.2 MB for SmolLM2's 512 x 576, 32 MB for an 8B teacher's 2048 x 4096) is a
    fresh allocation each time, which glibc gives back to the system and takes again, so its pages fault in on
    every row: this VM writes fresh memory at 0.2-0.8 GB/s. Reused, the encoding pool with raw rows took 0.61
    core-seconds per GB on one thread instead of 0.82, and no page faults instead of 27k per GB
    (bench/encode_pool.py, docs/results/write-path.md, fifth pass). The buffer lives as long as its thread: one row
    per encoding thread, and one in the thread that captures when it takes stats itself (``writer_threads`` 0)."""
    buf = getattr(_SCRATCH, "row", None)
    if buf is None or buf.shape != shape:
        buf = _SCRATCH.row = torch.empty(shape, dtype=torch.float32)
    return buf


def batch_stats(x: torch.Tensor) -> dict:
    """Stats of one (B, T, C) batch in its storage dtype.

    One row at a time, copied into this thread's float32 buffer and squared in place: the copy stays in cache, at
    about twice the speed of whole-batch temporaries on the write path (bench/write_path.py), and the buffer is
    the same memory for every row (``_row_buffer``). Each token's RMS is the same float32 ops on the same values
    (x*x is what pow(2) computes; the mean is over each token alone), and the absmax is exact in the storage
    dtype (``aminmax``), so the stats are bit for bit the former ones."""
    x = x.cpu()
    # each row copied into the buffer (never the caller's float32 tensor itself), squared in place
    parts = [b.mul_(b).mean(-1).sqrt_().reshape(-1) for b in (_row_buffer(r.shape).copy_(r) for r in x)]
    rms = torch.cat(parts).numpy() if parts else np.zeros(0, dtype=np.float32)
    absmax = 0.0
    if x.numel():
        lo, hi = torch.aminmax(x)
        absmax = max(abs(float(lo)), abs(float(hi)))
    finite = np.isfinite(rms)
    if not finite.all():  # rare: drop the tokens that overflowed, and any non-finite value from absmax
        rms = rms[finite]
        a = x.float().abs()
        a = a[torch.isfinite(a)]
        absmax = float(a.max()) if a.numel() else 0.0
    return {
        "rms_units": _units(np.ascontiguousarray(rms, dtype=np.float32)),
        "tokens": int(rms.size),
        "absmax": absmax,
        "nonfinite": int(finite.size - rms.size),
    }


def error_stats(bits: np.ndarray, stored: np.ndarray) -> dict:
    """``qerr``/``qsig`` of one (B, T, C) batch: the teacher's bf16 bits and the stored ones."""
    from zgdata.store.quant import error_sums

    e, s = error_sums(bits, stored)
    return {"qerr": [int(v) for v in np.ldexp(e, _ERR_EXP)], "qsig": [int(v) for v in np.ldexp(s, _ERR_EXP)]}


def combine(a: dict, b: dict) -> dict:
    """Stats of two parts together (exact; commutative and associative)."""
    out = _combine(a, b)
    for k in ("qerr", "qsig"):
        if k in a or k in b:
            xa, xb = a.get(k) or [0] * len(b[k]), b.get(k) or [0] * len(a[k])
            out[k] = [int(u) + int(v) for u, v in zip(xa, xb)]
    return out


def _combine(a: dict, b: dict) -> dict:
    return {
        "rms_units": int(a["rms_units"]) + int(b["rms_units"]),
        "tokens": a["tokens"] + b["tokens"],
        "absmax": max(a["absmax"], b["absmax"]),
        "nonfinite": a.get("nonfinite", 0) + b.get("nonfinite", 0),
    }


def summary(s: dict) -> dict:
    """What the boundary's schema metadata records: mean_rms (rounded once) and absmax."""
    from fractions import Fraction

    mean = float(Fraction(int(s["rms_units"]), (1 << _UNIT_EXP) * max(s["tokens"], 1)))
    out = {"mean_rms": mean, "absmax": s["absmax"]}
    if s.get("nonfinite"):
        out["nonfinite_tokens"] = s["nonfinite"]
    if s.get("qsig"):
        out["quant_error"] = quant_error(s["qerr"], s["qsig"])
    return out


def quant_error(qerr: list, qsig: list) -> dict:
    """Relative RMS error of the boundary, and of its worst channel (channels that are all zero skipped)."""
    from fractions import Fraction

    rel = float(Fraction(sum(qerr), max(sum(qsig), 1))) ** 0.5
    ratios = [(Fraction(e, s), c) for c, (e, s) in enumerate(zip(qerr, qsig)) if s]
    worst, ch = max(ratios) if ratios else (Fraction(0), None)
    return {"rel_rms": rel, "worst_channel_rel_rms": float(worst) ** 0.5, "worst_channel": ch}

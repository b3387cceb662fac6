"""The quantized boundary codecs (``int8``, ``int7``, ``int6``): per-token scales with each token's outliers kept exact.

A residual stream has a few massive channels, 100-1000x the typical magnitude (SmolLM2-135M's reach
hundreds where most values are below one). A per-token int scale sized to them would leave the other
channels a handful of levels, so each token keeps its ``outliers`` largest values (by absolute value)
exact, as their channel index (uint16) and their bf16 bits, and scales the rest:

    scale = max |x| over the token's other channels / qmax       (float32; qmax = 2**(bits-1) - 1)
    q     = clip(rint(x / scale), -qmax, qmax)                    (int8; 0 at the outlier channels)
    x'    = bf16(q * scale)   (float32 product, rounded to nearest even), the outliers' bits put back

The outliers are chosen per token, so there is nothing to choose ahead of the data: the scheme is the
same function of each token's values alone, whatever the batch, shard, resume point or thread count.
``int7`` and ``int6`` use 127 and 63 levels of the same int8 bytes; the int bytes of each row are one zstd frame (fast
strategy, as ``zstd_fast``), where the fewer levels take fewer bits.

Both the stored path (the writer encodes, the reader decodes with ``dequantize``) and the online path
(``roundtrip``: the same ``quantize`` then ``dequantize``, in the same numpy code) give the same bits,
so cached == online stays bitwise by construction. Only bf16 storage is quantized.
"""

from __future__ import annotations

import numpy as np

from zgdata.capture_version import QUANT_CODECS, quant_scheme

__all__ = [
    "QUANT",
    "is_quantized",
    "scheme",
    "quantize",
    "dequantize",
    "roundtrip",
    "roundtrip_tensor",
    "error_sums",
    "f32",
    "bf16_bits",
]

# codec -> (bits, outliers per token), with the scheme, in zgdata/capture_version.py: the DVC materialize stage
# depends on that file, so a change of scheme there reruns materialize (change this file's arithmetic only with it)
QUANT = QUANT_CODECS


def is_quantized(codec: str) -> bool:
    return codec in QUANT


def scheme(codec: str) -> dict:
    """The codec's parameters as lineage (fingerprint, zg.codec, zg data inspect)."""
    return quant_scheme(codec)


def f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> the same values as float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even (as torch's cast; NaN stays a quiet NaN)."""
    b = x.view(np.uint32)
    out = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((b[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def _outlier_idx(bits: np.ndarray, k: int) -> np.ndarray:
    """(..., k) channel indices of each token's k largest |x|, ascending; ties to the lowest channel, NaN first.

    The key (the magnitude's bf16 bits, then the channel reversed) is unique per channel, so the top k are one
    set and ``argpartition`` (10x a sort) finds the same channels on every machine."""
    if k == 0:
        return np.zeros((*bits.shape[:-1], 0), dtype=np.int64)
    c = bits.shape[-1]
    key = ((bits & np.uint16(0x7FFF)).astype(np.uint32) << np.uint32(16)) | (
        np.uint32(0xFFFF) - np.arange(c, dtype=np.uint32)
    )
    idx = np.argpartition(key, c - k, axis=-1)[..., c - k :] if k < c else np.broadcast_to(np.arange(c), key.shape)
    return np.sort(idx, axis=-1)


def quantize(bits: np.ndarray, codec: str, *, nbits: int | None = None, outliers: int | None = None):
    """(N, T, C) bf16 bits -> (q int8 (N, T, C), scale float32 (N, T), idx uint16 (N, T, k), val uint16 (N, T, k)).

    ``nbits``/``outliers`` override the codec's (the frontier bench only)."""
    nbits = QUANT[codec][0] if nbits is None else nbits
    outliers = QUANT[codec][1] if outliers is None else outliers
    qmax = np.float32(2 ** (nbits - 1) - 1)
    x = f32(bits)
    k = min(int(outliers), x.shape[-1])
    idx = _outlier_idx(bits, k)
    a = np.abs(x)
    if k:
        np.put_along_axis(a, idx, np.float32(0), axis=-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scale = (a.max(axis=-1) / qmax).astype(np.float32) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
        scale = np.where(np.isfinite(scale), scale, np.float32(0)).astype(np.float32)  # inf/NaN: see the outliers
        safe = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
        q = np.rint(x / safe[..., None])
        q = np.where(np.isfinite(q), np.clip(q, -qmax, qmax), 0).astype(np.int8)
    if k:
        np.put_along_axis(q, idx, np.int8(0), axis=-1)
    val = np.take_along_axis(bits, idx, axis=-1) if k else np.zeros(idx.shape, dtype=np.uint16)
    return q, scale, idx.astype(np.uint16), val.astype(np.uint16)


def dequantize(q: np.ndarray, scale: np.ndarray, idx: np.ndarray, val: np.ndarray, *, out=None) -> np.ndarray:
    """The stored values' bf16 bits (N, T, C) from ``quantize``'s arrays (into ``out`` when given)."""
    y = bf16_bits(q.astype(np.float32) * scale[..., None])
    if idx.shape[-1]:
        np.put_along_axis(y, idx.astype(np.int64), val, axis=-1)
    if out is None:
        return y
    out[...] = y
    return out


def roundtrip(bits: np.ndarray, codec: str) -> np.ndarray:
    """What the codec stores for these (N, T, C) bf16 bits: ``dequantize(quantize(...))``, the online path's."""
    return dequantize(*quantize(bits, codec))


def roundtrip_tensor(x, codec: str):
    """``roundtrip`` of a (B, T, C) bf16 tensor (any device), as a bf16 tensor on that device; lossless: ``x``."""
    import torch

    if not is_quantized(codec):
        return x
    if x.dtype != torch.bfloat16:
        raise ValueError(f"codec {codec} quantizes bfloat16 only, not {x.dtype}")
    bits = x.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
    y = roundtrip(bits.reshape(x.shape), codec)
    return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16).to(x.device)


def error_sums(bits: np.ndarray, stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel: (sum of squared error, sum of squared value) over the tokens of (N, T, C) bf16 bits, in float64."""
    x = f32(bits).astype(np.float64).reshape(-1, bits.shape[-1])
    d = x - f32(stored).astype(np.float64).reshape(x.shape)
    bad = ~np.isfinite(x)  # a non-finite value (kept exact as an outlier, or not) counts in neither sum
    if bad.any():
        x, d = np.where(bad, 0.0, x), np.where(bad, 0.0, d)
    return (d * d).sum(axis=0), (x * x).sum(axis=0)

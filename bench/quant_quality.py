"""What training on quantized boundaries costs a student: two projects that differ only in `materialize.codec`,
each run through `dvc repro`, compared on every eval set, on the same tokens, with a paired bootstrap interval.

    zg init --profile smollm2 lossless && (cd lossless && dvc repro)              # zstd_blob, the default
    cp -a lossless q7 && sed -i 's/^  codec: zstd_blob$/  codec: int7/' q7/params.yaml && (cd q7 && dvc repro)
    python bench/quant_quality.py lossless q7

Both students score every eval set of the first project's params (the in-domain held-out split first). The change in
CE gap is the quantized student's CE minus the lossless student's (the teacher, the same in both, cancels). Its
interval is a bootstrap over whole sequences of the per-sequence NLL differences (zgtrain/evaluate/bootstrap.py,
1000 resamples, seed 0): paired, so the spread the two students share does not widen it. It prints one line per
set and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def set_nll(model, evalset, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence NLL sums and scored-token counts of ``model`` on ``evalset``."""
    from zgtrain.evaluate.bootstrap import per_sequence
    from zgtrain.evaluate.metrics import token_nll

    nll = token_nll(model, evalset.ids, evalset.batch_size or batch_size)  # (N, T-1)
    mask = evalset.mask
    keep = np.ones(tuple(nll.shape), dtype=bool) if mask is None else mask.numpy()
    seq = np.broadcast_to(np.arange(nll.shape[0])[:, None], nll.shape)
    n = nll.shape[0]
    return per_sequence(nll.numpy()[keep], seq[keep], n), per_sequence(np.ones(keep.sum()), seq[keep], n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lossless", type=Path)
    ap.add_argument("quantized", type=Path)
    args = ap.parse_args()
    from zgdata.layout import Layout
    from zgdata.teacher.prepare import load_tokenizer
    from zgtrain.evaluate.bootstrap import ratio_interval
    from zgtrain.evaluate.run import eval_sets
    from zgtrain.evaluate.sets import heldout_set
    from zgtrain.project.config import ProjectConfig
    from zgtrain.student.load import load_student

    a, b = Layout(args.lossless.resolve()), Layout(args.quantized.resolve())
    project = ProjectConfig.load(a.root / "params.yaml")
    codecs = [ProjectConfig.load(x.root / "params.yaml").materialize.codec for x in (a, b)]
    held, _ = heldout_set(a, project.eval.heldout_seqs)
    sets = eval_sets(project, a, held, load_tokenizer(a))
    students = [load_student(x.student) for x in (a, b)]
    reported = [json.loads((x.root / "metrics" / "eval.json").read_text()) for x in (a, b)]
    out = {"codecs": codecs, "sets": {}}
    for s in sets:
        (na, ta), (nb, _) = (set_nll(m, s, project.eval.batch_size) for m in students)
        delta = float((nb - na).sum() / ta.sum())
        ci = ratio_interval(nb - na, ta, resamples=1000, seed=0)
        gaps = [r["sets"][s.name]["ce_gap"] if s.name in r.get("sets", {}) else None for r in reported]
        out["sets"][s.name] = {"ce_gap_change": delta, "ci95": [ci["lo"], ci["hi"]], "ce_gaps": gaps}
        print(
            f"{s.name:12s} CE gap change {codecs[1]} - {codecs[0]}: {delta:+.4f} [{ci['lo']:+.4f}, {ci['hi']:+.4f}]"
            f"   (gaps reported by evaluate: {gaps[0]:+.4f} / {gaps[1]:+.4f})",
            flush=True,
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()

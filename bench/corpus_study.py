"""What the conversion corpus does to a student off its corpus: students of the default conversion trained on
different corpora (bench/corpus_study.sh), scored on the same tokens: the first project's eval sets (its
in-domain held-out plays first, then `docs`), with the same teacher.

    bash bench/corpus_study.sh /tmp/cs          # runs the arms, then this script
    python bench/corpus_study.py /tmp/cs/plays /tmp/cs/sample /tmp/cs/mix0 /tmp/cs/mix1 /tmp/cs/mix2

Per arm and set: the CE gap (student CE - teacher CE, nats per token) with a bootstrap 95% interval over whole
sequences, and its change against the first arm with a paired interval (the per-sequence NLL differences;
zgtrain/evaluate/bootstrap.py, 1000 resamples, seed 0). Arms named mixN are seeds of one arm: their mean and
spread are printed too. Then each student's greedy continuation of the first 32 tokens of two `docs` rows and one
held-out row, next to the teacher's. Last line: one JSON object (also written to --json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import numpy as np
import torch
from quant_quality import set_nll  # bench/quant_quality.py: per-sequence NLL sums and token counts


def continuation(model, tok, ids: torch.Tensor, prompt: int = 32, new: int = 24) -> str:
    with torch.no_grad():
        out = model.generate(ids[None, :prompt], max_new_tokens=new, do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, prompt:], skip_special_tokens=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("projects", type=Path, nargs="+", help="the baseline project first")
    ap.add_argument("--times", type=Path, help="bench/corpus_study.sh's times.txt")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from zgdata.layout import Layout
    from zgdata.teacher.prepare import load_teacher, load_tokenizer
    from zgtrain.evaluate.bootstrap import ratio_interval
    from zgtrain.evaluate.run import eval_sets
    from zgtrain.evaluate.sets import heldout_set
    from zgtrain.project.config import ProjectConfig
    from zgtrain.student.load import load_student

    torch.set_num_threads(2)
    layouts = [Layout(p.resolve()) for p in args.projects]
    names = [p.name for p in args.projects]
    base = layouts[0]
    project = ProjectConfig.load(base.root / "params.yaml")
    tok = load_tokenizer(base)
    held, _ = heldout_set(base, project.eval.heldout_seqs)
    sets = eval_sets(project, base, held, tok)
    teacher, _ = load_teacher(base, with_tokenizer=False)
    times = {}
    if args.times and args.times.exists():
        for line in args.times.read_text().splitlines():
            name, *kv = line.split()
            times[name] = {k: int(v) for k, v in (x.split("=") for x in kv)}
    out = {"arms": names, "sets": {}, "times": times, "samples": {}}
    t_nll = {s.name: set_nll(teacher, s, project.eval.batch_size) for s in sets}
    students = {}
    for name, lay in zip(names, layouts, strict=True):
        students[name] = load_student(lay.student)
        for s in sets:
            (tn, count), (sn, _) = t_nll[s.name], set_nll(students[name], s, project.eval.batch_size)
            row = out["sets"].setdefault(s.name, {})
            gap = float((sn - tn).sum() / count.sum())
            ci = ratio_interval(sn - tn, count, resamples=1000, seed=0)
            row[name] = {"ce_gap": gap, "ci95": [ci["lo"], ci["hi"]], "nll": sn.tolist()}
            if name != names[0]:
                bn = np.asarray(row[names[0]]["nll"])
                d = ratio_interval(sn - bn, count, resamples=1000, seed=0)
                row[name]["change"] = float((sn - bn).sum() / count.sum())
                row[name]["change_ci95"] = [d["lo"], d["hi"]]
            ch = (
                f"   vs {names[0]}: {row[name]['change']:+.3f} [{row[name]['change_ci95'][0]:+.3f}, "
                f"{row[name]['change_ci95'][1]:+.3f}]"
                if name != names[0]
                else ""
            )
            print(f"{s.name:8s} {name:8s} CE gap {gap:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]{ch}", flush=True)
    seeds = [n for n in names if re.fullmatch(r"mix\d+", n)]
    if len(seeds) > 1:
        for s in sets:
            gaps = [out["sets"][s.name][n]["ce_gap"] for n in seeds]
            out["sets"][s.name]["mix_seeds"] = {"mean": statistics.mean(gaps), "sd": statistics.stdev(gaps)}
            print(
                f"{s.name:8s} mix over {len(seeds)} seeds: {statistics.mean(gaps):.3f} +- {statistics.stdev(gaps):.3f}"
            )
    for s in sets:
        for row in s.ids[:2] if s.name != held.name else s.ids[:1]:
            key = f"{s.name}: {tok.decode(row[:32], skip_special_tokens=True)!r}"
            out["samples"][key] = {"teacher": continuation(teacher, tok, row)}
            for name in names:
                out["samples"][key][name] = continuation(students[name], tok, row)
    for key, conts in out["samples"].items():
        print(f"\n{key}")
        for who, text in conts.items():
            print(f"  {who:8s} {text!r}")
    for rows in out["sets"].values():
        for v in rows.values():
            v.pop("nll", None)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}))


if __name__ == "__main__":
    main()

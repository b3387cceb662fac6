"""The issue 14 study (NOT RUN YET: it trains 6 blocks x 5 variants of the default teacher, hours on 2 cores).

For each budget (fraction of the teacher's block parameters), the searched mix against the uniform conversion
of each variant: held-out CE, CE gap, context retention, gates (CE recovered is left out: it needs an
untrained reference per mix); plus a Pareto plot
(parameters vs held-out CE) of every uniform candidate and the chosen mixes, and the wall time of the search.

    zg init study --profile search && cd study && git add -A && git commit -qm init
    time dvc repro search                 # teacher, tokens, materialize (the one teacher pass) + every variant
    python /path/to/zerograph/bench/search_study.py --project . --budgets 0.5 0.625 0.75 --out docs/search

Every mix is assembled in memory (zgtrain/assemble.py ``build_from_blocks``) and scored as `zg train evaluate`
scores the student (same held-out rows, context targets and gates from params.yaml).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _mix_model(project, layout, mix: dict):
    from zgdata.families import config_from_dict
    from zgdata.teacher import load_slice
    from zgtrain.assemble import build_from_blocks
    from zgtrain.checkpoint import load_block
    from zgtrain.conversions import identity
    from zgtrain.variants import VariantLayout

    blocks = []
    for spec in project.partition.blocks():
        if mix[spec.key] == "teacher":
            t, m = load_slice(layout.teacher_slice(spec.key))
            blocks.append((spec, identity(t, config_from_dict(m["config"]), None, None, None),
                           {"state_sha256": None, "fingerprints": {}, "teacher_layers": m["layers"]}))
        else:
            b, meta = load_block(VariantLayout(root=layout.root, block=spec.key, variant=mix[spec.key]), spec.key)
            blocks.append((spec, b, meta))
    return build_from_blocks(blocks, layout=layout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.625, 0.75])
    ap.add_argument("--out", type=Path, default=Path("docs/search"))
    a = ap.parse_args()

    import numpy as np

    from zgdata.layout import Layout
    from zgdata.teacher import load_teacher
    from zgdata.tokens import open_tokens, read_tokens
    from zgtrain.config import ProjectConfig
    from zgtrain.evaluate import _model_scores, gate_verdicts
    from zgtrain.metrics import context_targets
    from zgtrain.search import options, solve

    layout = Layout(a.project)
    project = ProjectConfig.load(layout.params)
    tokens = open_tokens(layout)
    splits = np.asarray(tokens.to_table(columns=["split"]).column("split").to_pylist())
    rows = np.flatnonzero(splits == "heldout")
    ids, _ = read_tokens(layout, rows, ds=tokens)
    targets = context_targets(len(ids), ids.shape[1], k=project.eval.context_targets,
                              min_pos=project.eval.context_min_pos, seed=project.eval.seed)
    score = lambda model: _model_scores(model, ids, targets, project.eval)  # noqa: E731
    teacher = score(load_teacher(layout, with_tokenizer=False)[0])

    t0 = time.perf_counter()
    opts = options(project, layout)
    blocks = list(opts)
    choices = [[(o["params"], o["ce_delta"]) for o in opts[b]] for b in blocks]
    total = sum(o[0]["params"] for o in opts.values())
    mixes = {f"search@{b}": {k: opts[k][j]["variant"] for k, j in zip(blocks, solve(choices, b * total))}
             for b in a.budgets}
    search_s = time.perf_counter() - t0
    for v in project.variants:
        mixes[f"uniform:{v}"] = {k: v for k in blocks}

    rows_out = {}
    for name, mix in mixes.items():
        model, summary = _mix_model(project, layout, mix)
        s = score(model)
        gap = s["ce"] - teacher["ce"]
        retention = s["context_use"] / teacher["context_use"]
        rows_out[name] = {"mix": mix, "params": summary["params"], "param_ratio": summary["param_ratio"],
                          "ce": s["ce"], "ce_gap": gap, "context_retention": retention,
                          "gates": gate_verdicts(project.gates, gap, retention)["all"]}
        print(json.dumps({name: rows_out[name]}))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "study.json").write_text(json.dumps({"teacher": teacher, "mixes": rows_out,
                                                  "search_seconds": search_s}, indent=2))
    (a.out / "pareto.csv").write_text("name,params,ce\n" + "".join(
        f"{n},{r['params']},{r['ce']:.6f}\n" for n, r in rows_out.items()))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, r in rows_out.items():
        ax.scatter(r["params"], r["ce"], marker="*" if n.startswith("search") else "o")
        ax.annotate(n, (r["params"], r["ce"]), fontsize=7)
    ax.axhline(teacher["ce"], ls="--", c="gray")
    ax.set_xlabel("parameters"); ax.set_ylabel("held-out CE (nats/token)")
    fig.tight_layout(); fig.savefig(a.out / "pareto.png", dpi=100)


if __name__ == "__main__":
    main()

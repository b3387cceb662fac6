"""The budgeted-search study: the budgeted search against the uniform conversion of the same size.

In a project made with `zg init --profile search` (or tiny-search, for a smoke run), for each budget (a fraction
of the teacher's block parameters):

  search arm   `dvc exp run -S search.budget=B search_assemble`: the search picks the mix, search_assemble
               judges it on every eval set and tries the next-best mixes when it fails a gate
               (metrics/search_eval.json: CE, gap, CE recovered, context retention, gates per try)
  uniform arm  `dvc exp run -S train.conversion=prune_mlp -S train.prune_ratio=R evaluate`: the main pipeline's
               uniform MLP prune, R chosen so its block parameters are the closest to (not above) the searched
               mix's (metrics/eval.json: the same figures)

With --repair-steps N (Puzzle's order: local training, search, then global distillation of the chosen mix), the
script first commits repair.steps N and the regenerated dvc.yaml to the project; each budget's arms then target
`search_repair` (the kept mix repaired and judged again: metrics/search_repair.json) and `evaluate` (which runs
the main pipeline's `repair` and gates models/repaired): the same repair for both arms of a budget, and the
figures before repair from the same runs. study.json gains search+repair@B and uniform+repair@B.

Arms already in OUT/study.json for other budgets are kept, so budgets can be run in separate invocations: e.g.
0.625 and 0.75 without repair, then 0.5 with --repair-steps. The runs are bitwise deterministic on one machine;
on another CPU model the figures can move in the last digits (about 1e-6 nats, docs/RESULTS.md).

Every arm runs in the one workspace, so it reuses the one materialize and every variant stage (`dvc exp run`
restores what is up to date). OUT gets study.json (every arm's figures and wall time), pareto.csv and
pareto.png: block parameters vs held-out CE of every candidate (the teacher with one block replaced by one
variant: the replace-one-block CE), the searched mixes and the uniform conversions. study.json's "cost" puts the
wall time of the search (its first arm trains every variant) next to what online targets would have added to the
same variant trainings (ONLINE_RATES, below).

    zg init study --profile search && cd study && git add -A && git commit -qm init
    python /path/to/zerograph/bench/search_study.py --project . --budgets 0.5 0.625 0.75 --out search_study
    python /path/to/zerograph/bench/search_study.py --project . --budgets 0.5 --repair-steps 32 --out search_study
    python /path/to/zerograph/bench/search_study.py --project . --out search_study --cost-only   # redo "cost"
    python /path/to/zerograph/bench/search_study.py --project . --out search_study --plot-only   # redraw the PNG
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# Training tokens/s of each default block, cached against online targets, measured on the default teacher
# (prune_mlp 0.5, 100 steps of 4 x 512 tokens, one idle 2-core machine): docs/RESULTS.md, "Cached == online on
# the default teacher, bitwise" (`dvc exp run -n online -S train.targets=online`). Online targets rerun the
# teacher's layers 0..end of the block every step, whatever the student is, so each step of a variant of that
# block pays the same extra seconds: tokens_per_step * (1 / online - 1 / cached).
ONLINE_RATES = {
    "b00": (1755, 1185),
    "b01": (1650, 878),
    "b02": (1682, 730),
    "b03": (1646, 602),
    "b04": (1692, 469),
    "b05": (1777, 468),
}


def variant_scores(root: Path) -> list[dict]:
    """Every variant stage's metrics (metrics/variants/BLOCK/NAME.json), in block then name order."""
    return [json.loads(p.read_text()) for p in sorted((root / "metrics" / "variants").glob("*/*.json"))]


def cost(root: Path, arms: dict) -> dict:
    """Wall time of the search (the first search arm: every variant stage, the search, the assemble loop) and
    the extra seconds online targets would have cost the same variant trainings."""
    import yaml

    params = yaml.safe_load((root / "params.yaml").read_text())
    per_step = params["train"]["batch_size"] * params["corpus"]["seq_len"]
    variants = variant_scores(root)
    extra, steps, unknown = 0.0, 0, set()
    for x in variants:
        steps += x["steps"]
        if x["block"] not in ONLINE_RATES:
            unknown.add(x["block"])
            continue
        cached, online = ONLINE_RATES[x["block"]]
        extra += x["steps"] * per_step * (1 / online - 1 / cached)
    first = next((r for n, r in arms.items() if n.startswith("search@") and "seconds" in r), None)
    out = {
        "variant_stages": len(variants),
        "variant_steps": steps,
        "search_wall_s": first["seconds"] if first else None,
        "online_extra_s": None if unknown else extra,
        "online_rates_tokens_per_s": ONLINE_RATES,
    }
    if unknown:
        out["note"] = f"no measured online rate for blocks {sorted(unknown)} (not the default partition)"
    return out


def exp_run(root: Path, sets: dict, target: str, dry: bool) -> float:
    """One arm: the committed params.yaml with SETS, as a `dvc exp run` of TARGET (its results stay applied)."""
    cmd = ["dvc", "exp", "run", target] + [a for k, v in sets.items() for a in ("-S", f"{k}={v}")]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if not dry:  # an earlier arm's -S values stay in the workspace: start from the committed params
        subprocess.run(["git", "checkout", "--", "params.yaml"], cwd=root, check=True)
        subprocess.run(cmd, cwd=root, check=True)
    return time.perf_counter() - t0


def enable_repair(root: Path, steps: int, dry: bool) -> None:
    """Commit repair.steps STEPS and the dvc.yaml it generates (search_repair, repair) to the project."""
    import yaml

    from zgtrain.project.pipeline import dump_params

    print(f"# params.yaml repair.steps: {steps}; zg pipeline; git commit", file=sys.stderr, flush=True)
    if dry:
        return
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params.setdefault("repair", {})["steps"] = steps
    path.write_text(dump_params(params))
    subprocess.run(["zg", "pipeline"], cwd=root, check=True)
    subprocess.run(["git", "add", "params.yaml", "dvc.yaml"], cwd=root, check=True)
    if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=root).returncode:  # else committed already
        subprocess.run(["git", "commit", "-qm", f"search study: repair.steps {steps}"], cwd=root, check=True)


def prune_ratio_for(root: Path, params: int) -> float:
    """The largest uniform MLP prune ratio whose block params stay <= PARAMS (a variant's metrics give the sizes)."""
    from zgtrain.project.config import ProjectConfig

    project = ProjectConfig.load(root / "params.yaml")
    m = variant_scores(root)
    mlp_full = {}
    for x in m:  # a prune variant's saving per pruned channel gives the MLP's share of each block
        v = project.variant(x["block"], x["variant"]).train
        if v.conversion == "prune_mlp" and v.prune_ratio > 0:
            mlp_full[x["block"]] = (x["teacher_params"] - x["params"]) / v.prune_ratio
    teacher = sum(x["teacher_params"] for x in {x["block"]: x for x in m}.values())
    ratio = (teacher - params) / sum(mlp_full.values())
    return min(0.95, max(0.0, round(ratio + 0.005, 2)))  # round up: the channel count rounds down


def candidates(root: Path) -> list[dict]:
    out = variant_scores(root)
    total = sum({x["block"]: x["teacher_params"] for x in out}.values())
    return [
        {
            "name": f"{x['block']}/{x['variant']}",
            "params": total - x["teacher_params"] + x["params"],
            "ce": x["replace_ce"],
        }
        for x in out
    ]


def plot(rows: list[tuple], path: Path) -> None:
    """Block parameters vs held-out CE. The y axis ends 0.5 nats above the worst mix: candidates beyond it (layer
    drops that break the model) are drawn on the top edge as triangles, labelled with their CE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = [c for _, k, _, c in rows if k != "candidate"]
    ce = sorted(c for _, k, _, c in rows)
    top = (max(mixes) if mixes else ce[len(ce) * 9 // 10]) + 0.5
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, marker in (
        ("candidate", "."),
        ("search", "*"),
        ("uniform", "s"),
        ("search+repair", "P"),
        ("uniform+repair", "D"),
    ):
        pts = [(p, c, n) for n, k, p, c in rows if k == kind and c <= top]
        if pts:
            ax.scatter([p for p, _, _ in pts], [c for _, c, _ in pts], marker=marker, label=kind)
            if kind != "candidate":
                for p, c, n in pts:
                    ax.annotate(n, (p, c), fontsize=7)
    off = [(p, c, n) for n, k, p, c in rows if c > top]
    if off:
        ax.scatter([p for p, _, _ in off], [top] * len(off), marker="^", color="grey", label="off scale")
        for i, (p, c, n) in enumerate(off):
            ax.annotate(f"{n} {c:.1f}", (p, top), fontsize=6, xytext=(0, -8 - 7 * i), textcoords="offset points")
    ax.set_ylim(top=top + 0.05)
    ax.set_xlabel("block parameters")
    ax.set_ylabel("held-out CE (nats/token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.625, 0.75])
    ap.add_argument("--out", type=Path, default=Path("search_study"))
    ap.add_argument(
        "--repair-steps",
        type=int,
        default=0,
        help="repair both arms of each budget: commit repair.steps N (and dvc.yaml) to the project first",
    )
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--cost-only", action="store_true", help="recompute study.json's cost from OUT and the project")
    ap.add_argument("--plot-only", action="store_true", help="redraw OUT/pareto.png from OUT/pareto.csv")
    a = ap.parse_args()
    if a.plot_only:
        lines = (a.out / "pareto.csv").read_text().splitlines()[1:]
        plot([(n, k, int(p), float(c)) for n, k, p, c in (ln.split(",") for ln in lines)], a.out / "pareto.png")
        return
    root = a.project.resolve()
    if a.cost_only:
        study = json.loads((a.out / "study.json").read_text())
        study["cost"] = cost(root, study["arms"])
        (a.out / "study.json").write_text(json.dumps(study, indent=2) + "\n")
        print(json.dumps(study["cost"], indent=1))
        return
    if a.repair_steps:
        enable_repair(root, a.repair_steps, a.dry_run)
    old = a.out / "study.json"
    arms = json.loads(old.read_text())["arms"] if old.exists() and not a.dry_run else {}
    for b in a.budgets:
        secs = exp_run(root, {"search.budget": b}, "search_assemble", a.dry_run)
        if a.dry_run:
            if a.repair_steps:
                exp_run(root, {"search.budget": b}, "search_repair", a.dry_run)
            continue
        ev = json.loads((root / "metrics" / "search_eval.json").read_text())
        pick = ev["selected"] if ev["passed"] else ev["unmet"]["closest_try"]
        t = ev["tries"][pick]
        arms[f"search@{b}"] = {
            "mix": t["mix"],
            "params": t["params"],
            "heldout": t["sets"]["heldout"],
            "sets": t["sets"],
            "gates_passed": t["gates_passed"]["all"],
            "tries": len(ev["tries"]),
            "seconds": secs,
        }
        if a.repair_steps:
            secs = exp_run(root, {"search.budget": b}, "search_repair", a.dry_run)
            r = json.loads((root / "metrics" / "search_repair.json").read_text())
            arms[f"search+repair@{b}"] = {
                "mix": r["mix"],
                "params": r["params"],
                "heldout": r["sets"]["heldout"],
                "sets": r["sets"],
                "gates_passed": r["passed"],
                "repair_steps": r["steps"],
                "ce_gap_closed": r["ce_gap_closed"],
                "seconds": secs,
            }
        ratio = prune_ratio_for(root, t["params"])
        secs = exp_run(root, {"train.conversion": "prune_mlp", "train.prune_ratio": ratio}, "evaluate", a.dry_run)
        e = json.loads((root / "metrics" / "eval.json").read_text())
        summary = json.loads((root / "models" / "student" / "zerograph.json").read_text())
        block_params = sum(
            json.loads((root / "metrics" / "blocks" / f"{k}.json").read_text())["params"] for k in summary["blocks"]
        )
        student_gates = e.get("student_gates_passed", e["gates_passed"])  # with repair, gates_passed judges it
        arms[f"uniform@{b}"] = {
            "prune_ratio": ratio,
            "params": block_params,
            "heldout": e["sets"]["heldout"],
            "sets": e["sets"],
            "gates_passed": student_gates["all"],
            "seconds": secs,
        }
        if a.repair_steps:
            sets = {n: {"student_ce": f["ce"], **f} for n, f in e["repaired"]["sets"].items()}
            arms[f"uniform+repair@{b}"] = {
                "prune_ratio": ratio,
                "params": block_params,
                "heldout": sets["heldout"],
                "sets": sets,
                "gates_passed": e["gates_passed"]["all"],
                "repair_steps": a.repair_steps,
                "seconds": None,
            }  # inside uniform's
        print(json.dumps({k: v for k, v in arms.items() if k.endswith(f"@{b}")}, indent=1, default=str))
    if a.dry_run:
        return
    a.out.mkdir(parents=True, exist_ok=True)
    cands = candidates(root)
    (a.out / "study.json").write_text(
        json.dumps({"arms": arms, "candidates": cands, "cost": cost(root, arms)}, indent=2) + "\n"
    )
    rows = [(c["name"], "candidate", c["params"], c["ce"]) for c in cands]
    rows += [(n, n.split("@")[0], r["params"], r["heldout"]["student_ce"]) for n, r in arms.items()]
    (a.out / "pareto.csv").write_text(
        "name,kind,params,ce\n" + "".join(f"{n},{k},{p},{c:.6f}\n" for n, k, p, c in rows)
    )
    plot(rows, a.out / "pareto.png")


if __name__ == "__main__":
    main()

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
on another CPU model the figures can move in the last digits (about 1e-6 nats, docs/results/search-study.md).

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

With --cost kv_bytes the budgets are fractions of the teacher's KV-cache bytes per token at its longest
context (search.cost: kv_bytes, zgtrain/block/kv_cache.py) and the uniform arms are the attention conversions of the
main pipeline that fit the same budget, each an `evaluate` run (metrics/eval.json; its size record gives the
student's KV bytes): window@B (window_attention everywhere, the widest window W with W / max_position_embeddings
<= B) and kvheads@B (kv_heads everywhere, the most KV heads n, a divisor of the teacher's, with n / teacher's <= B;
none when even one head is over the budget); and, once, linear@B (linear_attention everywhere, when the
conversion exists) at the headline budget. study.json's "long_context" lists the long-context eval set's
(--long-set, the search profile's `long`) CE and context retention of the teacher and of every arm.

--seeds N repeats every arm of the headline budget (--headline, default the first budget) with train.seed 1 .. N-1
(the blocks' and variants' seed offset: every block and variant stage trains again), as ARM#seedS; study.json's
"seeds" gives each arm's held-out CE and gap per seed, their mean, min and max (the 95% intervals of each run are
the bootstrap ones in its "sets", as before).

    python /path/to/zerograph/bench/search_study.py --project . --cost kv_bytes --budgets 0.25 0.5 \
        --headline 0.5 --seeds 3 --out kv_study

To add seeds to a study already run, or to run two seeds at once on two cores: copy the project after its
materialize (`cp -a`), run `--seed S` in each copy with `--set train.threads=1` (the copies share the cores;
evaluation threads follow OMP_NUM_THREADS) and their own --out, then `--merge` their OUT folders into the study's.
`--arms` runs only the named arms (e.g. `search kvheads`: the window arm at 0.5 is the teacher's attention at
these lengths, the linear arm fails by far).

    OMP_NUM_THREADS=1 python .../search_study.py --project /tmp/kv1 --cost kv_bytes --budgets 0.5 --seed 1 \
        --arms search kvheads --set train.threads=1 --out /tmp/kv1_out
    python .../search_study.py --project /tmp/kv1 --headline 0.5 --out kv_study --merge /tmp/kv1_out /tmp/kv2_out
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import run

# Training tokens/s of each default block, cached against online targets, measured on the default teacher (prune_mlp
# 0.5, 100 steps of 4 x 512 tokens, one idle 2-core machine): docs/results/objective-study.md, "Cached == online on
# the default teacher, bitwise" (`dvc exp run -n online -S train.targets=online`). Online targets rerun the
# teacher's layers 0..end of the block every step, whatever the student is, so each step of a variant of that block
# pays the same extra seconds: tokens_per_step * (1 / online - 1 / cached).
ONLINE_RATES = {
    "b00": (1755, 1185),
    "b01": (1650, 878),
    "b02": (1682, 730),
    "b03": (1646, 602),
    "b04": (1692, 469),
    "b05": (1777, 468),
}


def variant_scores(root: Path) -> list[dict]:
    """Every variant stage's metrics (metrics/variants/BLOCK/NAME.json), in block then name order.

    A file without the keys the study reads (one an older zg left there, or a stage's partial write) is named on
    stderr and skipped, so one stale file does not stop the study."""
    out = []
    for p in sorted((root / "metrics" / "variants").glob("*/*.json")):
        try:
            x = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            print(f"skipping {p}: not readable JSON ({e})", file=sys.stderr)
            continue
        if not isinstance(x, dict) or not {"block", "steps"} <= x.keys():
            print(f"skipping {p}: no block and steps (stale metrics of another zg?)", file=sys.stderr)
            continue
        out.append(x)
    return out


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
        for c in (["git", "checkout", "--", "params.yaml"], cmd):
            code = run(c, root, code=None, capture=False).code  # dvc's stages run this environment's zg
            if code:  # the callers record an arm that fails and go on with the next
                raise subprocess.CalledProcessError(code, c)
    return time.perf_counter() - t0


def enable_repair(root: Path, steps: int, dry: bool) -> None:
    """Commit repair.steps STEPS and the dvc.yaml it generates (search_repair, repair) to the project."""
    import yaml

    from zgtrain.pipeline.stages import dump_params

    print(f"# params.yaml repair.steps: {steps}; zg pipeline; git commit", file=sys.stderr, flush=True)
    if dry:
        return
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params.setdefault("repair", {})["steps"] = steps
    path.write_text(dump_params(params))
    run(["zg", "pipeline"], root, capture=False)
    run(["git", "add", "params.yaml", "dvc.yaml"], root, capture=False)
    if run(["git", "diff", "--cached", "--quiet"], root, code=None, capture=False).code:  # else committed already
        run(["git", "commit", "-qm", f"search study: repair.steps {steps}"], root, capture=False)


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


COST_KEYS = {"params": ("params", "teacher_params"), "kv_bytes": ("kv_bytes_per_token", "teacher_kv_bytes_per_token")}
COST_LABELS = {"params": "block parameters", "kv_bytes": "KV-cache bytes per token (teacher's longest context)"}


def candidates(root: Path, cost: str = "params") -> list[dict]:
    """The teacher with one block replaced by one variant: its total COST and its replace-one-block CE."""
    own, teacher = COST_KEYS[cost]
    out = variant_scores(root)
    total = sum({x["block"]: x[teacher] for x in out}.values())
    return [
        {"name": f"{x['block']}/{x['variant']}", cost: total - x[teacher] + x[own], "ce": x["replace_ce"]} for x in out
    ]


def teacher_shape(root: Path) -> dict | None:
    """The teacher's longest context and KV heads (teacher.json's architecture), None before the teacher stage."""
    path = root / "models" / "teacher" / "teacher.json"
    if not path.exists():
        return None
    arch = json.loads(path.read_text())["architecture"]
    return {"max_positions": int(arch["max_positions"]), "kv_heads": int(arch["num_kv_heads"])}


def kv_uniform(shape: dict | None, budget: float) -> dict[str, dict]:
    """The uniform attention conversions whose KV bytes fit BUDGET (a fraction of the teacher's): {arm: -S sets}."""
    if shape is None:  # a dry run before the teacher stage: the rule, not the numbers
        return {
            "window": {"train.conversion": "window_attention", "train.window": f"floor({budget}*max_positions)"},
            "kvheads": {"train.conversion": "kv_heads", "train.kv_heads": f"<largest divisor n, n/kv_heads<={budget}>"},
        }
    out = {}
    window = int(budget * shape["max_positions"])  # a window-W layer caches min(W, L) of L positions
    if window >= 1:
        out["window"] = {"train.conversion": "window_attention", "train.window": window}
    fits = [
        n for n in range(1, shape["kv_heads"] + 1) if shape["kv_heads"] % n == 0 and n <= budget * shape["kv_heads"]
    ]
    if fits:
        out["kvheads"] = {"train.conversion": "kv_heads", "train.kv_heads": max(fits)}
    return out


def has_linear_attention() -> bool:
    from zgtrain.project.names import CONVERSIONS

    return "linear_attention" in CONVERSIONS


def uniform_arm(root: Path, sets: dict, secs: float) -> dict:
    """A main-pipeline arm's figures after its `evaluate`: metrics/eval.json's sets and size."""
    e = json.loads((root / "metrics" / "eval.json").read_text())
    size = e.get("size") or {}
    student_gates = e.get("student_gates_passed", e["gates_passed"])
    return {
        "train": {k.removeprefix("train."): v for k, v in sets.items() if k.startswith("train.")},
        "params": size.get("params"),
        "kv_bytes": size.get("kv_bytes_per_token"),
        "kv_ratio": size.get("kv_ratio"),
        "heldout": e["sets"]["heldout"],
        "sets": e["sets"],
        "gates_passed": student_gates["all"],
        "seconds": secs,
    }


def long_context(arms: dict, name: str) -> dict:
    """The long-context set's teacher figures and each arm's CE, gap and context retention (with intervals)."""
    out: dict = {}
    for arm, r in arms.items():
        f = (r.get("sets") or {}).get(name)
        if not f:
            continue
        teacher = out.setdefault("teacher", {})  # the same teacher in every arm; some reports lack its context use
        teacher.update({k: f[k] for k in ("teacher_ce", "teacher_context_use") if k in f and k not in teacher})
        out[arm] = {
            k: f.get(k) for k in ("student_ce", "ce_gap", "ce_gap_ci95", "context_retention", "context_retention_ci95")
        }
        out[arm]["kv_ratio"] = r.get("kv_ratio")
    return out


def seed_summary(arms: dict, budget: float) -> dict:
    """Each arm of BUDGET over its seeds (ARM@B and ARM@B#seedS): held-out CE and gap per seed, mean, min, max."""
    out: dict = {}
    for arm, r in arms.items():
        base, _, seed = arm.partition("#seed")
        if not base.endswith(f"@{budget}") or "heldout" not in r:
            continue
        row = out.setdefault(base, {"seeds": [], "student_ce": [], "ce_gap": []})
        row["seeds"].append(int(seed or 0))
        row["student_ce"].append(r["heldout"]["student_ce"])
        row["ce_gap"].append(r["heldout"]["ce_gap"])
    for row in out.values():
        for k in ("student_ce", "ce_gap"):
            v = row[k]
            row[f"{k}_mean"], row[f"{k}_min"], row[f"{k}_max"] = sum(v) / len(v), min(v), max(v)
    return out


def plot(rows: list[tuple], path: Path, cost: str = "params") -> None:
    """Block parameters (or KV bytes per token) vs held-out CE. The y axis ends 0.5 nats above the worst mix: candidates beyond it (layer
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
        ("window", "v"),
        ("kvheads", "<"),
        ("linear", "X"),
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
    ax.set_xlabel(COST_LABELS[cost])
    ax.set_ylabel("held-out CE (nats/token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def search_arm(root: Path, b: float, extra: dict, a) -> dict:
    """The search arm of budget B (and, with --repair-steps, its repair): figures of the kept try."""
    sets = (
        {**extra, "search.budget": b}
        if a.cost == "params"
        else {**extra, "search.cost": "kv_bytes", "search.budget": b}
    )
    secs = exp_run(root, sets, "search_assemble", a.dry_run)
    out: dict = {}
    if not a.dry_run:
        ev = json.loads((root / "metrics" / "search_eval.json").read_text())
        pick = ev["selected"] if ev["passed"] else ev["unmet"]["closest_try"]
        t = ev["tries"][pick]
        out["search"] = {
            "mix": t["mix"],
            "params": t["params"],
            "kv_bytes": t.get("kv_bytes"),
            "kv_ratio": t.get("model_kv_ratio"),
            "heldout": t["sets"]["heldout"],
            "sets": t["sets"],
            "gates_passed": t["gates_passed"]["all"],
            "tries": len(ev["tries"]),
            "seconds": secs,
        }
    if a.repair_steps:
        secs = exp_run(root, sets, "search_repair", a.dry_run)
        if not a.dry_run:
            r = json.loads((root / "metrics" / "search_repair.json").read_text())
            out["search+repair"] = {
                "mix": r["mix"],
                "params": r["params"],
                "kv_bytes": out["search"]["kv_bytes"],
                "kv_ratio": out["search"]["kv_ratio"],
                "heldout": r["sets"]["heldout"],
                "sets": r["sets"],
                "gates_passed": r["passed"],
                "repair_steps": r["steps"],
                "ce_gap_closed": r["ce_gap_closed"],
                "seconds": secs,
            }
    return out


def prune_arm(root: Path, params: int, extra: dict, a) -> dict:
    """The uniform MLP prune of (at most) PARAMS block parameters (and, with --repair-steps, its repair)."""
    ratio = prune_ratio_for(root, params)
    sets = {**extra, "train.conversion": "prune_mlp", "train.prune_ratio": ratio}
    secs = exp_run(root, sets, "evaluate", a.dry_run)
    e = json.loads((root / "metrics" / "eval.json").read_text())
    summary = json.loads((root / "models" / "student" / "zerograph.json").read_text())
    block_params = sum(
        json.loads((root / "metrics" / "blocks" / f"{k}.json").read_text())["params"] for k in summary["blocks"]
    )
    out = {"uniform": {**uniform_arm(root, sets, secs), "prune_ratio": ratio, "params": block_params}}
    if a.repair_steps:
        rsets = {n: {"student_ce": f["ce"], **f} for n, f in e["repaired"]["sets"].items()}
        out["uniform+repair"] = {
            "prune_ratio": ratio,
            "params": block_params,
            "heldout": rsets["heldout"],
            "sets": rsets,
            "gates_passed": e["gates_passed"]["all"],
            "repair_steps": a.repair_steps,
            "seconds": None,
        }  # inside uniform's
    return out


def attention_arms(root: Path, b: float, extra: dict, a, headline: bool) -> dict:
    """--cost kv_bytes: the uniform attention conversions that fit budget B (window, kvheads; linear once)."""
    arms = kv_uniform(teacher_shape(root), b)
    if headline and has_linear_attention():
        arms["linear"] = {"train.conversion": "linear_attention"}
    if a.arms is not None:
        arms = {k: v for k, v in arms.items() if k in a.arms}
    out = {}
    for name, sets in arms.items():
        sets = {**extra, **sets}
        try:
            secs = exp_run(root, sets, "evaluate", a.dry_run)
        except subprocess.CalledProcessError as e:  # a conversion this teacher refuses: the other arms still run
            print(f"# {name}@{b}: failed ({e}); see its dvc output above", file=sys.stderr, flush=True)
            out[name] = {"train": sets, "error": str(e)}
            continue
        if not a.dry_run:
            out[name] = uniform_arm(root, sets, secs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.625, 0.75])
    ap.add_argument("--out", type=Path, default=Path("search_study"))
    ap.add_argument(
        "--cost",
        choices=("params", "kv_bytes"),
        default="params",
        help="what the budgets count (search.cost): block params (uniform arm: MLP prune) or KV bytes per token "
        "(uniform arms: windows, fewer KV heads, linear attention)",
    )
    ap.add_argument(
        "--seeds", type=int, default=1, help="run every arm of the headline budget with train.seed 0 .. N-1"
    )
    ap.add_argument("--headline", type=float, default=None, help="the budget --seeds repeats (default: the first)")
    ap.add_argument(
        "--seed",
        type=int,
        nargs="+",
        dest="seed_list",
        help="run exactly these train.seed values at the headline budget instead of 0 .. --seeds-1 (to add seeds "
        "to a study: each seed in its own copy of the project, then --merge)",
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        choices=("search", "window", "kvheads", "linear"),
        help="run only these arms (default: all that fit); with --cost params, search (the uniform prune arm, "
        "sized from its mix, always runs)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more -S for every arm, e.g. train.threads=1 when two copies of the project share the cores",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="add the arms of these OUT folders' study.json to OUT's (each copy's run), recompute long_context, "
        "seeds (--headline), pareto.csv and pareto.png; runs nothing",
    )
    ap.add_argument("--long-set", default="long", help="the long-context eval set reported in study.json")
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
    if a.seeds < 1:
        ap.error("--seeds must be >= 1")
    if a.seed_list and a.seeds != 1:
        ap.error("--seed names the seeds to run; --seeds N runs 0 .. N-1: give one of them")
    if a.cost == "params" and a.arms is not None and "search" not in a.arms:
        ap.error("with --cost params the uniform arm is sized from the search arm's mix: --arms must include search")
    if bad := [kv for kv in a.set if "=" not in kv.strip("=")]:
        ap.error(f"--set takes KEY=VALUE (a params.yaml key and its value), got {bad[0]!r}")
    if a.plot_only:
        head, *lines = (a.out / "pareto.csv").read_text().splitlines()
        unit = head.split(",")[2]
        plot([(n, k, float(p), float(c)) for n, k, p, c in (ln.split(",") for ln in lines)], a.out / "pareto.png", unit)
        return
    if a.merge:
        merge(a.out, a.merge, a.headline, a.long_set)
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
    headline = a.budgets[0] if a.headline is None else a.headline
    if headline not in a.budgets:
        ap.error(f"--headline {headline} is not one of --budgets")
    old = a.out / "study.json"
    arms = json.loads(old.read_text())["arms"] if old.exists() and not a.dry_run else {}
    sets = dict(kv.split("=", 1) for kv in a.set)
    for b in a.budgets:
        for seed in (a.seed_list or range(a.seeds)) if b == headline else [0]:
            extra, tag = ({**sets}, "") if seed == 0 else ({**sets, "train.seed": seed}, f"#seed{seed}")
            got = {}
            try:
                if a.arms is None or "search" in a.arms:
                    got = search_arm(root, b, extra, a)
            except subprocess.CalledProcessError as e:  # e.g. a budget below the cheapest mix: one line from zg
                print(f"# search@{b}{tag}: failed ({e}); see its dvc output above", file=sys.stderr, flush=True)
                arms[f"search@{b}{tag}"] = {"error": str(e)}
                continue
            if a.cost == "params":
                params = got["search"]["params"] if not a.dry_run else None
                if a.dry_run:
                    exp_run(
                        root, {**extra, "train.conversion": "prune_mlp", "train.prune_ratio": "R"}, "evaluate", True
                    )
                else:
                    got.update(prune_arm(root, params, extra, a))
            else:
                # linear attention has no budget knob: one arm per seed, whichever invocation ran it first
                ran = any(n.startswith("linear@") and n.partition("#")[1:] == tag.partition("#")[1:] for n in arms)
                got.update(attention_arms(root, b, extra, a, headline=b == headline and not ran))
            new = {f"{k}@{b}{tag}": v for k, v in got.items()}
            arms.update(new)
            print(json.dumps(new, indent=1, default=str))
    if a.dry_run:
        return
    a.out.mkdir(parents=True, exist_ok=True)
    cands = candidates(root, a.cost)
    study = {
        "cost_unit": a.cost,
        "arms": arms,
        "candidates": cands,
        "cost": cost(root, arms),
        "long_context": long_context(arms, a.long_set),
        "seeds": seed_summary(arms, headline) if any("#seed" in n for n in arms) else None,
    }
    write(a.out, study)


def write(out: Path, study: dict) -> None:
    """OUT/study.json, pareto.csv (every candidate and arm: cost vs held-out CE) and pareto.png."""
    (out / "study.json").write_text(json.dumps(study, indent=2) + "\n")
    cost_unit, cands, arms = study["cost_unit"], study["candidates"], study["arms"]
    key = "params" if cost_unit == "params" else "kv_bytes"
    rows = [(c["name"], "candidate", c[key], c["ce"]) for c in cands]
    rows += [
        (n, n.split("@")[0], r[key], r["heldout"]["student_ce"]) for n, r in arms.items() if r.get(key) is not None
    ]
    (out / "pareto.csv").write_text(f"name,kind,{key},ce\n" + "".join(f"{n},{k},{p},{c:.6f}\n" for n, k, p, c in rows))
    plot(rows, out / "pareto.png", cost_unit)


def merge(out: Path, others: list[Path], headline: float | None, long_set: str) -> None:
    """OUT's study with the arms of OTHERS' study.json added (runs of the same study in copies of the project)."""
    study = json.loads((out / "study.json").read_text())
    for o in others:
        other = json.loads((o / "study.json").read_text())
        if other["cost_unit"] != study["cost_unit"]:
            raise SystemExit(f"{o}/study.json counts {other['cost_unit']}, {out}/study.json {study['cost_unit']}")
        study["arms"].update({n: r for n, r in other["arms"].items() if "#seed" in n or n not in study["arms"]})
    study["long_context"] = long_context(study["arms"], long_set)
    if headline is None:
        headline = float(next(n for n in study["arms"] if n.startswith("search@")).split("@")[1].split("#")[0])
    study["seeds"] = seed_summary(study["arms"], headline)
    write(out, study)
    print(json.dumps(study["seeds"], indent=1))


if __name__ == "__main__":
    main()

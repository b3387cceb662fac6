"""The repair study, on the default teacher; results in docs/results/repair-study.md.

For each seed (the top-level `seed`, which seeds every block and the repair run), one
`zg init --profile smollm2` project and three arms that share its teacher, tokens and boundaries:

  base      the default conversion (`dvc repro`)                          -> metrics/eval.json
  repair    base + the repair stage (repair.steps = --repair-steps)        -> eval.json `repaired` entry
  matched   no repair; every block trains longer by the same extra tokens:
            train.steps += repair.steps * repair.batch_size / train.batch_size (rounded up), i.e. every
            layer sees as many extra sequences in block training as repair shows the whole model

Every arm runs the `lm_eval` stage on zg's offline `zg_nextline` task (--lm-eval), on teacher, student
and, in the repair arm, the repaired student. The repair arm reruns only `repair`, `evaluate` and
`lm_eval` (the blocks are up to date); the matched arm reruns the blocks, assemble, evaluate and lm_eval.
Each arm's metrics/eval.json (and lm_eval.json) is copied whole into OUT/seedN/, and the table printed at
the end gives every eval set's CE gap, its interval, CE recovered and the share of base's gap closed.

Cost on the project's 2-core machine, nothing else running: base about 19 minutes (materialize 2.8 min,
six blocks of 100 steps, evaluate 2.8 min, lm_eval 1.9 min); repair about 12 s a step (4 x 512 tokens:
a forward and backward of the whole 135M student plus its 49,152-wide head), so 96 steps are about 19
minutes, plus evaluate and lm_eval on three models; matched about as long as base plus the extra steps.

    python bench/repair_study.py --seeds 0 --repair-steps 96 --out bench/out/repair_study
    python bench/repair_study.py --seeds 1 2 --repair-steps 96 --cache /tmp/zg-repair-study/cache \
        --out bench/out/repair_study
    python bench/repair_study.py --dry-run            # print the commands only
    python bench/repair_study.py --table-only --seeds 0 1 --out bench/out/repair_study
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import harness


def sh(cmd: list[str], cwd: Path, dry: bool) -> None:
    print(f"[{cwd}] $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    if not dry:
        harness.run(cmd, cwd, capture=False)  # its output streams; this environment's bin first on PATH (zg, dvc)


def set_params(root: Path, updates: dict, dry: bool) -> None:
    print(f"[{root}] params: {updates}", file=sys.stderr)
    if dry:
        return

    def update(params: dict) -> None:
        for dotted, value in updates.items():
            *parents, leaf = dotted.split(".")
            node = params
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value

    harness.params(root, update)


def arm(root: Path, out: Path, name: str, dry: bool) -> None:
    sh(["zg", "pipeline"], root, dry)
    sh(["dvc", "repro"], root, dry)
    if not dry:
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "metrics" / "eval.json", out / f"{name}.json")
        if (root / "metrics" / "repair.json").exists() and name == "repair":
            shutil.copyfile(root / "metrics" / "repair.json", out / "repair_metrics.json")
        if (root / "metrics" / "lm_eval.json").exists():
            shutil.copyfile(root / "metrics" / "lm_eval.json", out / f"{name}_lm_eval.json")


def run_seed(seed: int, args) -> None:
    root = Path(args.work) / f"seed{seed}"
    out = Path(args.out) / f"seed{seed}"
    if root.exists() and not args.dry_run:
        shutil.rmtree(root)
    sh(["zg", "init", str(root), "--profile", "smollm2"], Path(args.work), args.dry_run)
    if args.cache:  # teacher, tokens and materialize do not depend on the seed: later seeds restore them
        sh(["dvc", "cache", "dir", str(Path(args.cache).resolve())], root, args.dry_run)
    set_params(root, {"seed": seed, "lm_eval.tasks": args.lm_eval}, args.dry_run)
    arm(root, out, "base", args.dry_run)

    set_params(
        root,
        {
            "repair.steps": args.repair_steps,
            "repair.batch_size": args.repair_batch,
            "repair.lr": args.repair_lr,
            "repair.temperature": args.temperature,
            "repair.ce_weight": args.ce_weight,
            "repair.trainable": args.trainable,
            "repair.warmup": args.warmup,
            "repair.threads": args.threads,
            "repair.checkpoint_every": 0,
        },
        args.dry_run,
    )
    arm(root, out, "repair", args.dry_run)
    if "matched" not in args.arms:
        return

    if args.dry_run:
        train = {"steps": 100, "batch_size": 4}  # the smollm2 profile's defaults, for the printout
    else:
        train = harness.params(root)["train"]
    extra = math.ceil(args.repair_steps * args.repair_batch / train["batch_size"])
    set_params(root, {"repair.steps": 0, "train.steps": train["steps"] + extra}, args.dry_run)
    arm(root, out, "matched", args.dry_run)


def _sets(ev: dict, arm_name: str) -> dict:
    """Every eval set's figures of the arm's final model: the repaired model's in the repair arm."""
    return ev["repaired"]["sets"] if arm_name == "repair" else ev["sets"]


def _lm_eval(d: Path, arm_name: str) -> str:
    p = d / f"{arm_name}_lm_eval.json"
    if not p.exists():
        return ""
    who = "repaired" if arm_name == "repair" else "student"
    cells = []
    for task, t in json.loads(p.read_text())["tasks"].items():
        cells.append(f"{task} {t['metric']} {t[who]:.3f} ({t[f'{who}_pct_of_teacher']:.0f}% of {t['teacher']:.3f})")
    return "; ".join(cells)


def table(args) -> str:
    """Per seed and arm: every eval set's CE gap (95% CI), CE recovered and, against base, the share of the gap
    closed; then the lm-eval headline metric of the arm's final model."""
    rows = [
        "| seed | arm | set | CE gap (95% CI) | CE recovered | gap closed vs base | lm-eval |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in args.seeds:
        d = Path(args.out) / f"seed{seed}"
        base = json.loads((d / "base.json").read_text())["sets"] if (d / "base.json").exists() else {}
        for name in ("base", "repair", "matched"):
            p = d / f"{name}.json"
            if not p.exists():
                continue
            sets = sorted(_sets(json.loads(p.read_text()), name).items(), key=lambda kv: kv[0] != "heldout")
            for i, (set_name, f) in enumerate(sets):  # the in-domain held-out split first
                ci = f.get("ce_gap_ci95") or {}
                gap0 = base.get(set_name, {}).get("ce_gap")
                closed = f"{(gap0 - f['ce_gap']) / gap0:.0%}" if gap0 and name != "base" else ""
                lm = _lm_eval(d, name) if i == 0 else ""
                rows.append(
                    f"| {seed} | {name} | {set_name} | {f['ce_gap']:.3f} ({ci.get('lo', float('nan')):.3f}-"
                    f"{ci.get('hi', float('nan')):.3f}) | {f['ce_recovered']:.3f} | {closed} | {lm} |"
                )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repair-steps", type=int, default=200)
    ap.add_argument("--repair-batch", type=int, default=4)
    ap.add_argument("--repair-lr", type=float, default=1e-4)
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--ce-weight", type=float, default=0.0)
    ap.add_argument("--trainable", default="all", choices=("all", "norms"))
    ap.add_argument("--warmup", type=int, default=10, help="repair.warmup")
    ap.add_argument("--threads", type=int, default=2, help="repair.threads (the blocks use train.threads)")
    ap.add_argument(
        "--lm-eval",
        nargs="*",
        default=["zg_nextline"],
        help="lm_eval.tasks of every arm (the lm_eval stage scores teacher, student and repaired)",
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        default=["base", "repair", "matched"],
        choices=("base", "repair", "matched"),
        help="run matched too, or stop after base + repair (the matched arm costs a second conversion)",
    )
    ap.add_argument("--work", default="/tmp/zg-repair-study", help="where the projects are built")
    ap.add_argument(
        "--cache",
        help="a DVC cache the seeds' projects share: the seed-independent stages (teacher, "
        "tokens, materialize: about 4 minutes) run once and later seeds restore them "
        "from its run cache",
    )
    ap.add_argument("--out", default=str(harness.OUT / "repair_study"), help="where each arm's eval.json is copied")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--table-only", action="store_true", help="print the table of an earlier run")
    args = ap.parse_args()
    if not args.table_only:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            run_seed(seed, args)
    if not args.dry_run:
        print(table(args))


if __name__ == "__main__":
    main()

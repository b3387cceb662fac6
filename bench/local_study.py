"""The greedy local pretraining study, as DVC experiments of `local` projects.

    python bench/local_study.py --workdir /tmp/zg-local-study --out bench/out/local_study          # print only
    python bench/local_study.py --workdir /tmp/zg-local-study --out bench/out/local_study --run

Setup: per lane, one `zg init --profile local` project (8 layers, hidden 256, SmolLM2 tokenizer, the
Shakespeare plays, seq_len 256) whose DVC cache is shared (`dvc cache dir`), `dvc repro tokens`
(the first lane tokenizes, the others restore from the run cache), then one `dvc exp run -S ...` per
arm. The lanes run side by side, each with `local.threads` threads (2 lanes x 1 thread on a 2-core
machine). Every arm trains on the same seeded batches (metrics/local.json `tokens_sha256` proves
it) for `--steps` steps of 8 sequences: budget-matched tokens. Arms:

- K in {1, 2, 4} (partition.boundaries), mlp aux, no MTP;
- MLP vs Transformer aux at K=4;
- MTP none / first / all at K=4 (Transformer aux);
- seeds 0, 1, 2 (local.seed) for K=1 and the K=4 headline arms (mlp and transformer aux), so each
  seed has its own gap to K=1;
- simultaneous vs sequential at K=4 (mlp aux, seed 0). The sequential arm runs last in its lane: its
  stages differ, so the script sets local.mode in params.yaml and runs `zg pipeline` before
  `dvc exp run` (an experiment includes the workspace's dvc.yaml). Each of its blocks trains
  `--steps` steps on the same batches: the same tokens per block as the simultaneous arm.

Each arm's metrics/local.json goes to OUT/arms/<arm>-s<seed>.json; OUT/study.json holds all of them
and the gaps; the table is printed. Activation memory and the schedule ratio come from
bench/local_schedule.py on the first lane's project.
"""

from __future__ import annotations

import argparse
import json
import shlex
import threading
from pathlib import Path

import harness

from zgdata.core.metrics_file import read_timings

K = {1: "[0,8]", 2: "[0,4,8]", 4: "[0,2,4,6,8]"}
# (name, relative cost per step, overrides); cost balances the lanes
ARMS = [
    ("K=1", 1.0, {"partition.boundaries": K[1]}),
    ("K=2 mlp", 1.6, {"partition.boundaries": K[2]}),
    ("K=4 mlp", 2.6, {"partition.boundaries": K[4]}),
    ("K=4 transformer", 2.8, {"partition.boundaries": K[4], "local.aux": "transformer"}),
    (
        "K=4 transformer mtp=first",
        3.3,
        {"partition.boundaries": K[4], "local.aux": "transformer", "local.mtp": "first"},
    ),
    ("K=4 transformer mtp=all", 5.0, {"partition.boundaries": K[4], "local.aux": "transformer", "local.mtp": "all"}),
    ("K=4 mlp sequential", 3.0, {"partition.boundaries": K[4], "local.mode": "sequential"}),
]
SEEDED = ("K=1", "K=4 mlp", "K=4 transformer")  # the arms that run with every seed
PLAIN = {"local.aux": "mlp", "local.mtp": "none"}  # `dvc exp run -S` leaves the last arm's values in params.yaml


def arms(seeds: list[int], seeded=SEEDED) -> list[tuple[str, int, float, dict]]:
    out = [(n, seeds[0], c, {**PLAIN, **o}) for n, c, o in ARMS]
    out += [(n, s, c, {**PLAIN, **o}) for s in seeds[1:] for n, c, o in ARMS if n in seeded]
    return out


def lanes(todo: list, n: int) -> list[list]:
    """Greedy longest-first split by cost; in a lane, the first seed first, the sequential arm last (it rewrites
    dvc.yaml)."""
    out, load = [[] for _ in range(n)], [0.0] * n
    for arm in sorted(todo, key=lambda a: -a[2]):
        i = load.index(min(load))
        out[i].append(arm)
        load[i] += arm[2]
    return [sorted(lane, key=lambda a: ("local.mode" in a[3], a[1])) for lane in out]


def _sh(cmd: list[str], cwd: Path, run: bool) -> str:
    print(f"$ (cd {cwd} && {shlex.join(cmd)})", flush=True)
    if not run:
        return ""
    ran = harness.run(cmd, cwd, code=None)  # this environment's bin first on PATH: its zg, its dvc
    if ran.code:  # RuntimeError, not harness's exit: a lane's thread would end silently on SystemExit
        raise RuntimeError(harness.failure(ran))
    return ran.stdout


def _slug(name: str, seed: int) -> str:
    return name.replace("=", "").replace(" ", "-") + f"-s{seed}"


def setup_lane(root: Path, cache: Path, base: dict, run: bool) -> None:
    if run and (root / "params.yaml").exists():
        print(f"# {root} exists: reused as it is", flush=True)
        return
    _sh(["zg", "init", str(root), "--profile", "local"], root.parent, run)
    _sh(["dvc", "cache", "dir", str(cache)], root, run)
    if run:
        harness.params(root, lambda p: p["local"].update(base))
    print(f"# params.yaml local: {base}", flush=True)
    _sh(["git", "add", "-A"], root, run)
    _sh(["git", "commit", "-qm", "zg init --profile local"], root, run)


def run_lane(root: Path, lane: list, steps: int, out: Path, run: bool) -> None:
    mode = harness.params(root)["local"]["mode"] if run else "simultaneous"  # a reused lane may be sequential
    for name, seed, _, over in lane:
        over = dict(over)
        want = over.pop("local.mode", "simultaneous")
        if want != mode:
            print(
                f"# params.yaml: local.mode={want}, partition.boundaries={over['partition.boundaries']}; "
                f"then zg pipeline",
                flush=True,
            )

            def switch(p, want=want, boundaries=json.loads(over["partition.boundaries"])):
                p["local"]["mode"], p["partition"]["boundaries"] = want, boundaries

            if run:
                harness.params(root, switch)
            _sh(["zg", "pipeline"], root, run)
            mode = want
        sets = [x for k, v in {**over, "local.seed": seed, "local.steps": steps}.items() for x in ("-S", f"{k}={v}")]
        _sh(["dvc", "exp", "run", *sets], root, run)
        if run:
            m = json.loads((root / "metrics" / "local.json").read_text())
            m.update(read_timings(root / "metrics" / "local.json"))  # tokens_per_s: kept out of the tracked file
            (out / "arms").mkdir(parents=True, exist_ok=True)
            (out / "arms" / f"{_slug(name, seed)}.json").write_text(
                json.dumps({"arm": name, "seed": seed, "set": over, **m}, indent=1)
            )


def table(out: Path) -> str:
    rows = [json.loads(p.read_text()) for p in sorted((out / "arms").glob("*.json"))]
    order = {n: i for i, (n, _, _) in enumerate(ARMS)}
    rows.sort(key=lambda r: (order[r["arm"]], r["seed"]))
    base = {r["seed"]: r["heldout_ce"] for r in rows if r["arm"] == "K=1"}
    lines = ["| arm | seed | held-out CE | gap to K=1 (nats) | tokens_sha256 | tokens/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        gap = r["heldout_ce"] - base[r["seed"]] if r["seed"] in base else float("nan")
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['heldout_ce']:.4f} | {gap:+.4f} | {r['tokens_sha256'][:12]} | "
            f"{r.get('tokens_per_s') or float('nan'):.0f} |"
        )
    (out / "study.json").write_text(json.dumps({"arms": rows, "k1_ce": base}, indent=1))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="per-arm metrics, study.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--seeded",
        nargs="+",
        default=list(SEEDED),
        choices=[n for n, _, _ in ARMS],
        help="the arms that run with every seed (the others: the first seed only)",
    )
    ap.add_argument("--only", nargs="+", metavar="ARM@SEED", help="run only these arms, e.g. 'K=1@2'")
    ap.add_argument("--steps", type=int, default=112, help="local.steps of every arm (x batch 8 x 256 tokens)")
    ap.add_argument("--warmup", type=int, default=11)
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--lanes", type=int, default=2, help="projects run side by side")
    ap.add_argument("--threads", type=int, default=1, help="local.threads of each lane")
    ap.add_argument("--table-only", action="store_true", help="print the table of OUT's arms")
    ap.add_argument("--run", action="store_true", help="run the commands (default: print them)")
    args = ap.parse_args()
    if args.table_only:
        print(table(args.out))
        return
    base = {"warmup": args.warmup, "precision": args.precision, "threads": args.threads, "checkpoint_every": 0}
    roots = [args.workdir / f"lane{i}" for i in range(args.lanes)]
    if args.run:
        args.workdir.mkdir(parents=True, exist_ok=True)
        args.out.mkdir(parents=True, exist_ok=True)
    for root in roots:
        setup_lane(root, args.workdir / "cache", base, args.run)
    for root in roots:  # the first tokenizes; the others restore tokens from the shared run cache
        _sh(["dvc", "repro", "tokens"], root, args.run)
    todo = [a for a in arms(args.seeds, args.seeded) if not args.only or f"{a[0]}@{a[1]}" in args.only]
    work = lanes(todo, args.lanes)
    threads = [
        threading.Thread(target=run_lane, args=(root, lane, args.steps, args.out, args.run))
        for root, lane in zip(roots, work)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if args.run:
        print(table(args.out))


if __name__ == "__main__":
    main()

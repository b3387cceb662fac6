"""The greedy local pretraining study of issue 17, as DVC experiments of one `local` project. NOT RUN YET.

    python bench/local_study.py --workdir /tmp/zg-local-study            # print the commands only
    python bench/local_study.py --workdir /tmp/zg-local-study --run      # run them (hours on 2 CPU cores)

Setup: `zg init --profile local` (8 layers, hidden 256, SmolLM2 tokenizer, the Shakespeare plays,
seq_len 256), `dvc repro tokens` once, then one `dvc exp run -S ...` per arm and seed. Every arm
trains on the same seeded batches (metrics/local.json `tokens_sha256` proves it) for local.steps
steps of local.batch_size sequences: budget-matched tokens. The table it prints holds each arm's
held-out CE of the full model and its gap to K=1 (same seed) in nats. Arms:

- K in {1, 2, 4} (partition.boundaries), mlp aux, no MTP;
- MLP vs Transformer aux at K=4;
- MTP none / first / all at K=4 (Transformer aux, the study's best head);
- 3 seeds (local.seed 0, 1, 2) for the K=4 headline arms and for K=1 (the gaps are per seed);
- simultaneous vs sequential at K=4 (mlp aux): the sequential arm runs last for each seed, because its
  stages differ: the script edits params.yaml, runs `zg pipeline`, then `dvc exp run` (an experiment
  includes the workspace's dvc.yaml), and switches back the same way. Each block of the sequential arm
  trains local.steps steps on the same batches: the same tokens per block as the simultaneous arm.
Activation memory and the schedule ratio come from bench/local_schedule.py on the same project.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

K = {1: "[0,8]", 2: "[0,4,8]", 4: "[0,2,4,6,8]"}
HEADLINE = [("K=4 mlp", {"aux": "mlp", "mtp": "none"}), ("K=4 transformer", {"aux": "transformer", "mtp": "none"}),
            ("K=4 transformer mtp=first", {"aux": "transformer", "mtp": "first"}),
            ("K=4 transformer mtp=all", {"aux": "transformer", "mtp": "all"})]


def arms(seeds: list[int]) -> list[tuple[str, int, dict]]:
    out = []
    for seed in seeds:
        # every arm sets every key the study varies: `dvc exp run -S` leaves the last arm's values in params.yaml
        plain = {"local.aux": "mlp", "local.mtp": "none"}
        out.append(("K=1 (end to end)", seed, {"partition.boundaries": K[1], **plain}))
        if seed == seeds[0]:
            out.append(("K=2 mlp", seed, {"partition.boundaries": K[2], **plain}))
        for name, over in HEADLINE:
            out.append((name, seed, {"partition.boundaries": K[4], **{f"local.{k}": v for k, v in over.items()}}))
        out.append(("K=4 mlp sequential", seed, {"partition.boundaries": K[4], **plain, "local.mode": "sequential"}))
    return out


def _pipeline(root: Path, mode: str, boundaries: str, run: bool) -> None:
    """Set local.mode and the partition in params.yaml, then regenerate dvc.yaml (its stages depend on the mode)."""
    print(f"# params.yaml: local.mode={mode}, partition.boundaries={boundaries}; then zg pipeline", flush=True)
    if run:
        import yaml

        p = yaml.safe_load((root / "params.yaml").read_text())
        p["local"]["mode"], p["partition"]["boundaries"] = mode, json.loads(boundaries)
        (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    _sh(["zg", "pipeline"], root, run)


def _sh(cmd: list[str], cwd: Path, run: bool) -> str:
    print(f"$ (cd {cwd} && {shlex.join(cmd)})", flush=True)
    if not run:
        return ""
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1000, help="local.steps of every arm (x batch 8 x 256 tokens)")
    ap.add_argument("--run", action="store_true", help="run the commands (default: print them)")
    args = ap.parse_args()
    root = args.workdir / "proj"
    if args.run:
        args.workdir.mkdir(parents=True, exist_ok=True)
    _sh(["zg", "init", str(root), "--profile", "local"], args.workdir, args.run)
    _sh(["git", "add", "-A"], root, args.run)
    _sh(["git", "commit", "-qm", "zg init --profile local"], root, args.run)
    _sh(["dvc", "repro", "tokens"], root, args.run)
    results, mode = [], "simultaneous"
    for name, seed, over in arms(args.seeds):
        want = over.pop("local.mode", "simultaneous")
        if want != mode:
            _pipeline(root, want, over["partition.boundaries"], args.run)
            mode = want
        sets = [x for k, v in {**over, "local.seed": seed, "local.steps": args.steps}.items() for x in ("-S", f"{k}={v}")]
        _sh(["dvc", "exp", "run", *sets], root, args.run)
        if args.run:
            m = json.loads((root / "metrics" / "local.json").read_text())
            results.append((name, seed, m))
    if not args.run:
        return
    base = {seed: m["heldout_ce"] for name, seed, m in results if name.startswith("K=1")}
    print("| arm | seed | held-out CE | gap to K=1 (nats) | tokens_sha256 | tokens/s |")
    print("|---|---|---|---|---|---|")
    for name, seed, m in results:
        print(f"| {name} | {seed} | {m['heldout_ce']:.4f} | {m['heldout_ce'] - base[seed]:+.4f} | "
              f"{m['tokens_sha256'][:12]} | {m.get('tokens_per_s') or float('nan'):.0f} |")


if __name__ == "__main__":
    main()

"""The measured search cost: the cost table and the searched student's predicted against measured latency, per runtime.

In a project whose variant library is trained (`zg init --profile tiny-search DIR && cd DIR && dvc repro search`,
or the `search` profile), for each runtime: set search.cost: latency at the budget, the workload's runtime (the other
workload keys as given), `zg pipeline`, `dvc repro search_assemble` (which runs search_cost, search and
search_assemble), then print the table's base and per-block medians and spreads, each uniform model's measured
total against its predicted sum, and the kept student's end-to-end measurement against its prediction
(metrics/search_eval.json's ``measured``). The project's params.yaml is left at the last runtime's settings.

    python bench/search_cost.py --project /tmp/zg49 --runtimes torch llama.cpp --budget 0.8 --out bench/out/search_cost_tiny.txt
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import yaml


def _set(project: Path, updates: dict) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params.setdefault("search", {}).update(updates)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def _run(project: Path, *cmd: str) -> str:
    res = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout + res.stderr


def report(project: Path, runtime: str, seconds: float) -> list[str]:
    table = json.loads((project / "search" / "cost" / "table.json").read_text())
    choice = json.loads((project / "search" / "choice.json").read_text())
    ev = json.loads((project / "metrics" / "search_eval.json").read_text())
    phase = f"{table['workload']['phase']}_ms"
    lines = [
        f"## runtime {runtime}: {table['machine']['kind']}; workload {table['workload']}",
        f"table measured in {table['seconds']:.1f} s; `dvc repro search_assemble` {seconds:.1f} s",
        f"base (embedding + head) {phase} {table['base'][phase]['median']:.4f} "
        f"(spread {table['base'][phase]['spread']:.0%})",
    ]
    for b, opts in table["blocks"].items():
        for o, c in opts.items():
            if c.get("expressible", True):
                lines.append(f"{b} {o}: {c[phase]['median']:.4f} ms (spread {c[phase]['spread']:.0%})")
            else:
                lines.append(f"{b} {o}: not expressible ({c['why']})")
    for o, m in table["models"].items():
        if m.get("measured"):
            lines.append(
                f"{o} everywhere: measured {m['measured'][phase]['median']:.4f}, predicted {m['predicted'][phase]:.4f} "
                f"({m['additivity'][phase]:+.1%})"
            )
    mix = {b: o["variant"] for b, o in choice["blocks"].items()}
    m = ev["measured"]
    written = ev["selected"] if ev["passed"] else ev["unmet"]["closest_try"]
    kept = (
        f"try {written + 1} {ev['tries'][written]['mix']} ({'passes' if ev['passed'] else 'closest miss of'} the gates)"
    )
    lines += [
        f"search: budget {choice['budget']} of the teacher's {choice['measured']['teacher_ms']:.4f} ms -> {mix} "
        f"(predicted {choice['measured']['predicted_ms']:.4f} ms)",
        f"kept student {kept}: "
        + ", ".join(
            f"{p} measured {m[p]['measured']['median']:.4f} (spread {m[p]['measured']['spread']:.0%}) vs predicted "
            f"{m[p]['predicted']:.4f} ({m[p]['error']:+.1%}; teacher alongside {m[p]['drift']:+.1%} off the table, "
            f"relative error {m[p]['relative_error']:+.1%})"
            for p in ("prefill_ms", "decode_ms", "request_ms")
        ),
        f"warning: {m['warning']}" if m["warning"] else "no warning (relative error and drift within 15%)",
        "",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--runtimes", nargs="+", default=["torch", "llama.cpp"])
    ap.add_argument("--budget", type=float, default=0.8)
    ap.add_argument("--workload", default="{}", help="JSON: search.workload keys besides runtime")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = []
    for runtime in args.runtimes:
        _set(
            args.project,
            {"cost": "latency", "budget": args.budget, "workload": {**json.loads(args.workload), "runtime": runtime}},
        )
        _run(args.project, "zg", "pipeline")
        t = time.perf_counter()
        _run(args.project, "dvc", "repro", "search_assemble")
        lines += report(args.project, runtime, time.perf_counter() - t)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            f"$ python bench/search_cost.py --project PROJECT --runtimes {' '.join(args.runtimes)} "
            f"--budget {args.budget} --workload '{args.workload}'\n\n{text}\n"
        )


if __name__ == "__main__":
    main()

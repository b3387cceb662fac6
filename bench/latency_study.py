"""The latency-budget study: the search on measured latency against the uniform prune of the same predicted latency
and the params-budget search of the same size, all timed end to end on llama.cpp beside the teacher.

In a project made with `zg init --profile search` whose params.yaml sets `search.cost: latency` and a
`search.workload` on `runtime: llama.cpp` (the variants llama.cpp can express: MLP prunes and layer drops), for each
budget B (a fraction of the teacher's latency in the workload's phase, embedding and head included):

  search@B   `dvc exp run -S search.budget=B search_assemble`: the exact solver's pool on the cost table
             (search/cost/table.json, measured by the search_cost stage), judged in order with the gate-aware
             retries; the kept student is timed against its prediction (metrics/search_eval.json "measured")
  params@B   `dvc exp run -S search.cost=params -S search.budget=P search_assemble`, P the block-parameter fraction
             of search@B's kept mix: the best mix of the same size by the parameter count, as before this issue
  uniform@B  `dvc exp run -S train.conversion=prune_mlp -S train.prune_ratio=R evaluate`: the main pipeline's
             uniform MLP prune, R the smallest ratio (to 0.01) whose latency, interpolated from the table's prune
             options block by block, is at most search@B's predicted latency

Each arm's student is exported with `zg export --format gguf` (f16, what the table timed) into OUT/gguf. The timing
pass then loads every GGUF and a GGUF of the teacher in llama.cpp at once and times them round-robin, ROUNDS rounds
of one request each (prompt, then generate decode steps), so that every model sees the same machine; a speedup is
the median over rounds of teacher / arm in the same round, with the rounds' range. The prediction error is the
measured speedup against the table's predicted one (the searched mixes: base + blocks; the uniform prune: the
interpolation). OUT gets study.json, study.txt and pareto.png (measured decode ms per token against held-out CE).

    zg init /tmp/lat --profile search && cd /tmp/lat    # then, in params.yaml: search: {cost: latency,
    #   workload: {runtime: llama.cpp, phase: decode, prompt: 512, generate: 64}}; variants p25 p50 p75 p90 drop3 drop2
    zg pipeline && git add -A && git commit -qm init && dvc repro --glob 'variant@*'
    python /path/to/zerograph/bench/latency_study.py --project . --budgets 0.7 0.5 --out /tmp/lat_out
    python /path/to/zerograph/bench/latency_study.py --project . --out /tmp/lat_out --time-only   # time again
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from harness import run
from search_study import exp_run, uniform_arm, variant_scores

from zgtrain.search.cost import predict

PHASE_KEYS = {"decode": ("decode_total",), "prefill": ("prefill_total",), "request": ("prefill_total", "decode_total")}


def prune_points(params: dict, table: dict, block: str, phase: str) -> list[tuple[float, float]]:
    """(prune ratio, ms) of a block's table options that are plain MLP prunes, the teacher's at 0, sorted."""
    opts = table["blocks"][block]
    pts = [(0.0, opts["teacher"][phase]["median"])]
    for name, v in params["variants"].items():
        if v.get("conversion") == "prune_mlp" and opts.get(name, {}).get("expressible", True):
            pts.append((float(v["prune_ratio"]), opts[name][phase]["median"]))
    return sorted(pts)


def interpolate(pts: list[tuple[float, float]], r: float) -> float:
    """Piecewise-linear ms at ratio R through PTS (extrapolated from the last segment past its end)."""
    for (r0, y0), (r1, y1) in zip(pts, pts[1:]):
        if r <= r1 or (r1, y1) == pts[-1]:
            return y0 + (y1 - y0) * (r - r0) / (r1 - r0)
    return pts[-1][1]


def uniform_ms(params: dict, table: dict, r: float, phase: str) -> float:
    """Predicted ms of the uniform prune at ratio R: the base plus every block's interpolated prune cost."""
    blocks = table["blocks"]
    return table["base"][phase]["median"] + sum(interpolate(prune_points(params, table, b, phase), r) for b in blocks)


def uniform_ratio(params: dict, table: dict, target_ms: float, phase: str) -> float:
    """The smallest prune ratio, to 0.01, whose predicted ms is at most TARGET_MS (0.95 at most)."""
    for k in range(0, 96):
        if uniform_ms(params, table, k / 100, phase) <= target_ms:
            return k / 100
    return 0.95


def kept_try(root: Path) -> dict:
    ev = json.loads((root / "metrics" / "search_eval.json").read_text())
    pick = ev["selected"] if ev["passed"] else ev["unmet"]["closest_try"]
    t = ev["tries"][pick]
    return {
        "mix": t["mix"],
        "params": t["params"],
        "heldout": t["sets"]["heldout"],
        "sets": t["sets"],
        "gates_passed": t["gates_passed"]["all"],
        "try": pick + 1,
        "tries": len(ev["tries"]),
        "pool": ev.get("pool"),
        "measured_in_assemble": ev.get("measured"),
    }


def export(root: Path, folder: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    run(["zg", "export", folder, "--format", "gguf", "--out", dest], root)
    return dest


def teacher_gguf(root: Path, dest: Path) -> Path:
    """The teacher rebuilt from its own slices (the identity mix), exported as the cost table's models are."""
    import os

    from zgdata.layout import Layout
    from zgdata.teacher.prepare import load_tokenizer, read_teacher_json
    from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
    from zgtrain.search.assemble import mix_blocks
    from zgtrain.search.llamacpp import export_for_timing
    from zgtrain.student.assemble import build_from_blocks

    here = Path.cwd()
    os.chdir(root)
    try:
        project, layout = ProjectConfig.load(Path("params.yaml")), Layout()
        mix = dict.fromkeys(project.blocks, IDENTITY_VARIANT)
        model, summary = build_from_blocks(mix_blocks(project, mix, layout), layout=layout)
        sha = read_teacher_json(layout)["weights_sha256"]
        folder = dest.parent / "teacher"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        got = export_for_timing(model.cpu(), summary, folder, load_tokenizer(layout), sha)
    finally:
        os.chdir(here)
    if isinstance(got, str):
        sys.exit(f"the teacher cannot be exported to GGUF: {got}")
    shutil.move(str(got), dest)
    shutil.rmtree(folder)
    return dest


def time_round_robin(ggufs: dict[str, Path], workload: dict, rounds: int, vocab: int) -> dict[str, list[dict]]:
    """{name: runs}: every GGUF loaded at once, one request of each in turn per round (warm-up in the first)."""
    from contextlib import ExitStack

    from zgtrain.search.cost import round_robin
    from zgtrain.search.llamacpp import llama_timer

    kw = {"prompt": workload["prompt"], "generate": workload["generate"], "threads": workload.get("threads", 1)}
    with ExitStack() as stack:
        runners = {k: stack.enter_context(llama_timer(p, vocab=vocab, **kw)) for k, p in ggufs.items()}
        return round_robin(
            runners,
            rounds,
            workload.get("warmup", 1),
            on_round=lambda i: print(f"# timing round {i + 1}/{rounds}", file=sys.stderr, flush=True),
        )


def per_unit_ms(runs: list[dict], phase: str, workload: dict) -> list[float]:
    """Milliseconds of each run: per generated token (decode), the prompt's (prefill) or the whole request's."""
    keys = PHASE_KEYS[phase]
    return [sum(r[k] for k in keys) * 1000 / (workload["generate"] if phase == "decode" else 1) for r in runs]


def timing_summary(runs: dict[str, list[dict]], phase: str, workload: dict) -> dict:
    """Per model: the median ms and its range; per arm: the speedup over the teacher paired by round."""
    ms = {k: per_unit_ms(v, phase, workload) for k, v in runs.items()}
    out = {}
    for k, xs in ms.items():
        ratios = [t / x for t, x in zip(ms["teacher"], xs)]
        out[k] = {
            "ms": statistics.median(xs),
            "ms_min": min(xs),
            "ms_max": max(xs),
            "speedup": statistics.median(ratios),
            "speedup_min": min(ratios),
            "speedup_max": max(ratios),
        }
    return out


def plot(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing, arms = study["timing"], study["arms"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    t = timing["teacher"]
    ax.scatter([t["ms"]], [study["teacher_ce"]], marker="*", s=140, color="black", label="teacher")
    styles = {"search": ("o", "tab:blue"), "params": ("s", "tab:green"), "uniform": ("D", "tab:orange")}
    for kind, (marker, color) in styles.items():
        pts = [(n, a) for n, a in arms.items() if n.startswith(kind + "@") and n in timing and "failed" not in a]
        if not pts:
            continue
        xs = [timing[n]["ms"] for n, _ in pts]
        ys = [a["heldout"]["student_ce"] for _, a in pts]
        xerr = [
            [timing[n]["ms"] - timing[n]["ms_min"] for n, _ in pts],
            [timing[n]["ms_max"] - timing[n]["ms"] for n, _ in pts],
        ]
        label = {"search": "latency search", "params": "params search, same size", "uniform": "uniform prune"}[kind]
        ax.errorbar(xs, ys, xerr=xerr, fmt=marker, color=color, label=label, capsize=3)
        for (n, a), x, y in zip(pts, xs, ys):
            ax.annotate(
                n.split("@")[1] + ("" if a["gates_passed"] else " (fails)"),
                (x, y),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
    w = study["workload"]
    ax.set_xlabel(
        f"measured {w['phase']} ms per token (llama.cpp f16, {w.get('threads', 1)} thread, prompt {w['prompt']})"
    )
    ax.set_ylabel("held-out CE (nats/token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def fmt_ci(f: dict, key: str) -> str:
    ci = f.get(f"{key}_ci95") or {}
    return f"{f[key]:.3f}" + (f" ({ci['lo']:.3f}-{ci['hi']:.3f})" if ci else "")


def report(study: dict) -> str:
    w, timing = study["workload"], study["timing"]
    lines = [
        f"workload {w}; machine {study['machine']}; {study['rounds']} timing rounds",
        f"teacher: {w['phase']} {timing['teacher']['ms']:.3f} ms ({timing['teacher']['ms_min']:.3f}-"
        f"{timing['teacher']['ms_max']:.3f}), held-out CE {study['teacher_ce']:.3f}",
        "| arm | mix / ratio | block params | held-out CE | CE gap (95% CI) | retention (95% CI) | docs gap | gates "
        "| measured ms | speedup (range) | predicted speedup | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, a in study["arms"].items():
        if "failed" in a:
            lines.append(f"| {n} | failed: {a['failed'].splitlines()[-1] if a['failed'] else '?'} |")
            continue
        h, t = a["heldout"], timing.get(n)
        what = ", ".join(a["mix"].values()) if "mix" in a else f"prune {a['prune_ratio']}"
        docs = a["sets"].get("docs", {}).get("ce_gap")
        meas = (
            f"{t['ms']:.3f} | {t['speedup']:.3f} ({t['speedup_min']:.3f}-{t['speedup_max']:.3f}) | "
            f"{a['predicted_speedup']:.3f} | {t['speedup'] / a['predicted_speedup'] - 1:+.1%}"
            if t
            else "- | - | - | -"
        )
        lines.append(
            f"| {n} | {what} | {a['params']:,} | {h['student_ce']:.3f} | {fmt_ci(h, 'ce_gap')} | "
            f"{fmt_ci(h, 'context_retention')} | {docs if docs is None else f'{docs:.3f}'} | "
            f"{'pass' if a['gates_passed'] else 'fail'} | {meas} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--budgets", type=float, nargs="*", default=[0.7, 0.5])
    ap.add_argument(
        "--arms",
        nargs="*",
        default=["search", "params", "uniform"],
        help="kinds run at every budget, or single arms (params@0.7) that take their search arm from OUT/study.json",
    )
    ap.add_argument("--rounds", type=int, default=15, help="timing rounds (one request of every model each)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--time-only", action="store_true", help="time the GGUFs already in OUT again")
    a = ap.parse_args()

    root, out = a.project.resolve(), a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spath = out / "study.json"
    study = json.loads(spath.read_text()) if spath.exists() else {"arms": {}}
    if not a.time_only:
        run_arms(root, out, a, study)
    table = study["table"]
    w = table["workload"]
    ggufs = {"teacher": out / "gguf" / "teacher.gguf"}
    if not ggufs["teacher"].exists():
        teacher_gguf(root, ggufs["teacher"])
    ggufs |= {n: out / "gguf" / f"{n}.gguf" for n in study["arms"] if (out / "gguf" / f"{n}.gguf").exists()}
    vocab = json.loads((root / "models" / "teacher" / "teacher.json").read_text())["architecture"]["vocab_size"]
    runs = time_round_robin(ggufs, w, a.rounds, vocab)
    study |= {"workload": w, "machine": table["machine"]["kind"], "rounds": a.rounds, "runs": runs}
    study["timing"] = timing_summary(runs, w["phase"], w)
    study["teacher_ce"] = next(a["heldout"]["teacher_ce"] for a in study["arms"].values() if "heldout" in a)
    (out / "study.json").write_text(json.dumps(study, indent=1) + "\n")
    text = report(study)
    (out / "study.txt").write_text(text + "\n")
    print(text)
    plot(study, out / "pareto.png")


def run_arms(root: Path, out: Path, a, study: dict) -> None:
    """Every arm of every budget in turn; an arm whose run fails is recorded as failed (with the tail of its
    error) and the study goes on (a budget whose search fails has no params or uniform arm: both take its mix)."""
    named = [float(x.split("@")[1]) for x in a.arms if "@" in x]  # single arms, e.g. params@0.7
    for b in dict.fromkeys([*a.budgets, *named]):
        for kind in ("search", "params", "uniform"):
            if kind not in a.arms and f"{kind}@{b}" not in a.arms:
                continue
            if kind != "search" and "heldout" not in study["arms"].get(f"search@{b}", {}):
                continue  # its search failed or never ran: there is no mix to match
            try:
                ARMS[kind](root, out, b, study)
            except (subprocess.CalledProcessError, SystemExit, OSError, KeyError, ValueError) as e:
                print(f"# {kind}@{b} failed: {e}", file=sys.stderr, flush=True)
                study["arms"][f"{kind}@{b}"] = {"failed": str(e)[-2000:]}
            save(out, study)


def search_arm(root: Path, out: Path, b: float, study: dict) -> None:
    secs = exp_run(root, {"search.budget": b}, "search_assemble", False)
    table = study["table"] = json.loads((root / "search" / "cost" / "table.json").read_text())
    phase, k = f"{table['workload']['phase']}_ms", kept_try(root)
    pm = predict(table, k["mix"], phase)
    study["arms"][f"search@{b}"] = {
        **k,
        "seconds": secs,
        "predicted_ms": pm,
        "predicted_speedup": teacher_ms(table) / pm,
    }
    export(root, "search", out / "gguf" / f"search@{b}.gguf")


def params_arm(root: Path, out: Path, b: float, study: dict) -> None:
    """The params-budget search at the block-parameter fraction of search@B's kept mix."""
    table, phase = study["table"], f"{study['table']['workload']['phase']}_ms"
    teacher_block_params = sum({x["block"]: x["teacher_params"] for x in variant_scores(root)}.values())
    frac = round(study["arms"][f"search@{b}"]["params"] / teacher_block_params + 5e-7, 6)
    secs = exp_run(root, {"search.cost": "params", "search.budget": frac}, "search_assemble", False)
    p = kept_try(root)
    pm = predict(table, p["mix"], phase)
    study["arms"][f"params@{b}"] = {
        **p,
        "budget": frac,
        "seconds": secs,
        "predicted_ms": pm,
        "predicted_speedup": teacher_ms(table) / pm,
    }
    export(root, "search", out / "gguf" / f"params@{b}.gguf")


def uniform_arm_of(root: Path, out: Path, b: float, study: dict) -> None:
    """The uniform MLP prune whose interpolated latency is at most search@B's predicted latency."""
    import yaml

    params = yaml.safe_load((root / "params.yaml").read_text())
    table, phase = study["table"], f"{study['table']['workload']['phase']}_ms"
    r = uniform_ratio(params, table, study["arms"][f"search@{b}"]["predicted_ms"], phase)
    sets = {"train.conversion": "prune_mlp", "train.prune_ratio": r}
    secs = exp_run(root, sets, "evaluate", False)
    u = uniform_arm(root, sets, secs)
    summary = json.loads((root / "models" / "student" / "zerograph.json").read_text())
    u["params"] = sum(
        json.loads((root / "metrics" / "blocks" / f"{k}.json").read_text())["params"] for k in summary["blocks"]
    )
    um = uniform_ms(params, table, r, phase)
    study["arms"][f"uniform@{b}"] = {
        **u,
        "prune_ratio": r,
        "predicted_ms": um,
        "predicted_speedup": teacher_ms(table) / um,
    }
    export(root, "student", out / "gguf" / f"uniform@{b}.gguf")


def teacher_ms(table: dict) -> float:
    return predict(table, dict.fromkeys(table["blocks"], "teacher"), f"{table['workload']['phase']}_ms")


ARMS = {"search": search_arm, "params": params_arm, "uniform": uniform_arm_of}


def save(out: Path, study: dict) -> None:
    (out / "study.json").write_text(json.dumps(study, indent=1) + "\n")


if __name__ == "__main__":
    main()

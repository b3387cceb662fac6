"""The measured cost table: every block option's latency and KV-cache bytes at ``search.workload``, on its runtime.

For each option (the teacher block, then each variant) one model is built with that option in every block (the
variant's trained weights, or the teacher's slices: the real shapes) and timed by zgtrain/search/measure.py.
Each block's cost is the summed time of its decoder layers; the embedding, the final norm and the head (the
"base") are measured once, on the teacher's model, as its total minus its layers. A mix is predicted to cost
base + the sum of its blocks' costs (``predict``); every uniform model's measured total is kept beside its
prediction (``additivity``), which says how far that sum can be trusted on this machine.

Per option and phase the table keeps the median over the timed runs, their min and max and ``spread`` =
(max - min) / median: the noise of this machine while it timed. Phases: ``prefill_ms`` (the prompt),
``decode_ms`` (per generated token, the mean over the steps) and ``request_ms`` (prefill + every step: one
request). ``kv_cache`` is the KV-cache bytes of the workload's sequences at their final length (batch x
(prompt + generate) positions, counted as zgtrain/block/kv_cache.py counts them: windows cache at most their
window, a linear_attention layer its constant state).

search/cost/table.json (the ``search_cost`` stage, layout.search_cost_table) is keyed by the runtime, the
machine's kind and the workload; the search refuses a table whose workload or options differ from params.yaml's.
"""

from __future__ import annotations

import json
import statistics

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig

__all__ = [
    "stats",
    "phases",
    "block_costs",
    "base_cost",
    "predict",
    "read_table",
    "options",
    "measure_student",
    "table_rows",
    "PHASES",
    "FIX",
    "WARN_ERROR",
]

PHASES = ("prefill_ms", "decode_ms", "request_ms")
FIX = "run `dvc repro search_cost` (or `zg search costs --measure`)"


def stats(xs: list[float]) -> dict:
    """Median, min, max and spread ((max - min) / median) of repeated timings."""
    med = statistics.median(xs)
    return {"median": med, "min": min(xs), "max": max(xs), "spread": (max(xs) - min(xs)) / med if med else 0.0}


def phases(prefill: list[float], decode: list[float], generate: int) -> dict:
    """Per-run seconds (prefill, decode summed over the steps) -> the three phases' stats, in ms."""
    return {
        "prefill_ms": stats([1e3 * p for p in prefill]),
        "decode_ms": stats([1e3 * d / generate for d in decode]),
        "request_ms": stats([1e3 * (p + d) for p, d in zip(prefill, decode)]),
    }


def block_costs(runs: list[dict], spans: dict[str, tuple[int, int]], generate: int) -> dict:
    """{block: phase stats} of one model's timed runs: each block's layers [start, end) summed per run."""
    return {
        b: phases([sum(r["prefill"][s:e]) for r in runs], [sum(r["decode"][s:e]) for r in runs], generate)
        for b, (s, e) in spans.items()
    }


def base_cost(runs: list[dict], generate: int) -> dict:
    """What a model costs besides its decoder layers (embedding, final norm, head, the glue): total - layers."""
    return phases(
        [r["prefill_total"] - sum(r["prefill"]) for r in runs],
        [r["decode_total"] - sum(r["decode"]) for r in runs],
        generate,
    )


def predict(table: dict, mix: dict[str, str], phase: str = "request_ms") -> float:
    """A mix's predicted milliseconds in a phase: the base plus each block's chosen option (medians)."""
    return table["base"][phase]["median"] + sum(table["blocks"][b][o][phase]["median"] for b, o in mix.items())


def options(project: ProjectConfig) -> list[str]:
    return [IDENTITY_VARIANT, *project.variants]


def read_table(project: ProjectConfig, layout: Layout) -> dict:
    """search/cost/table.json, checked against params.yaml's workload, blocks and variants."""
    path = layout.search_cost_table
    try:
        table = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is missing or unreadable (search.cost or search.limits needs it)", fix=FIX) from e
    want = project.search.served.as_dict()
    if table.get("workload") != want:
        raise ZgError(f"{path} was measured at workload {table.get('workload')}, not search.workload {want}", fix=FIX)
    got = {b: sorted(o) for b, o in table.get("blocks", {}).items()}  # the file's keys are sorted
    if got != {b: sorted(options(project)) for b in project.blocks}:
        raise ZgError(f"{path} does not cover params.yaml's blocks and variants", fix=FIX)
    return table


WARN_ERROR = 0.15  # a predicted latency further than this from the measured one is a warning in the report


def measure_student(project: ProjectConfig, layout: Layout, model, mix: dict) -> dict:
    """A searched student (``model``, the mix ``mix``) timed end to end at search.workload: the table's prediction
    (base + blocks) against the measurement, per phase, and a warning when the searched phase is off by more
    than WARN_ERROR."""
    from zgdata.families.registry import family_of
    from zgtrain.search.measure import timed_runs

    table, w = read_table(project, layout), project.search.served
    runs = timed_runs(
        model,
        family_of(model.config).layers(model),
        batch=w.batch,
        prompt=w.prompt,
        generate=w.generate,
        warmup=w.warmup,
        repeats=w.repeats,
        threads=w.threads,
    )
    measured = phases([r["prefill_total"] for r in runs], [r["decode_total"] for r in runs], w.generate)
    phase = f"{w.phase}_ms"
    out = {p: {"predicted": predict(table, mix, p), "measured": measured[p]} for p in PHASES}
    for p in PHASES:
        out[p]["error"] = out[p]["measured"]["median"] / out[p]["predicted"] - 1
    err = out[phase]["error"]
    warning = (
        f"the searched student's measured {phase} ({out[phase]['measured']['median']:.3f}) is {err:+.0%} off the "
        f"cost table's prediction ({out[phase]['predicted']:.3f}); spread across repeats "
        f"{out[phase]['measured']['spread']:.0%}"
        if abs(err) > WARN_ERROR
        else None
    )
    return {"phase": phase, "machine": table["machine"]["kind"], **out, "error": err, "warning": warning}


def table_rows(table: dict, phase: str) -> list[dict]:
    """One row per (block, option): its phase median and spread, its KV-cache bytes; the base first."""
    rows = [{"block": "(base)", "option": "embedding + head", **_row(table["base"], phase), "kv_cache": 0.0}]
    for b, opts in table["blocks"].items():
        rows += [{"block": b, "option": o, **_row(c, phase), "kv_cache": c["kv_cache"]} for o, c in opts.items()]
    return rows


def _row(cost: dict, phase: str) -> dict:
    return {"ms": cost[phase]["median"], "spread": cost[phase]["spread"]}

"""What the search writes about a mix: its totals, choice.json's entries, the constraints' bounds (a fraction of
the teacher's, the measured latency's embedding and head taken off every bound), the pool's records and the
measured table's summary. zgtrain/search/solve.py's ``run_search`` assembles them."""

from __future__ import annotations

import math

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import ProjectConfig
from zgtrain.project.workload import TABLE_COSTS
from zgtrain.search.pool import hamming, mix_key

__all__ = [
    "totals",
    "with_table",
    "base_of",
    "bounds",
    "unmet_limits",
    "entry",
    "constraint",
    "pool_entries",
    "measured",
]


def totals(opts: dict, idx) -> dict:
    """Params, KV bytes per token and active params of a mix (indices into each block's options), and its
    latency and kv_cache where the options carry the measured costs (block sums: no base)."""
    picked = [opts[b][j] for b, j in zip(opts, idx)]
    keys = ("params", "kv_bytes", "active_params", *(k for k in TABLE_COSTS if k in picked[0]))
    return {k: sum(o[k] for o in picked) for k in keys}


def with_table(project: ProjectConfig, layout: Layout, opts: dict) -> dict:
    """The measured cost table; each option of ``opts`` gains its ``latency`` (ms of search.workload.phase) and
    ``kv_cache`` (bytes) from it."""
    from zgtrain.search.cost import read_table

    table = read_table(project, layout)
    phase = f"{project.search.served.phase}_ms"
    for b, block_opts in opts.items():
        for o in block_opts:
            cost = table["blocks"][b][o["variant"]]
            # an option the runtime cannot run (llama.cpp: export refused it) fits no latency budget
            latency = cost[phase]["median"] if cost.get("expressible", True) else math.inf
            o.update(latency=latency, kv_cache=cost["kv_cache"])
    table["phase"] = phase
    return table


def base_of(cost: str, table: dict | None) -> float:
    """What every mix pays besides its blocks: the embedding and head's measured latency; 0 for the rest."""
    return table["base"][table["phase"]]["median"] if cost == "latency" and table else 0.0


def bounds(cfg, teacher: dict, table: dict | None) -> dict:
    """{cost: the blocks' bound} of every constraint (search.cost's budget first). A fraction is of the teacher's
    whole cost (for latency: base + blocks); the base comes off each bound, since every mix pays it."""
    out = {}
    for cost, bound in cfg.constraints.items():
        base = base_of(cost, table)
        out[cost] = bound * (teacher[cost] + base) - base if cfg.budget_unit == "fraction" else bound - base
    return out


def unmet_limits(cfg) -> ZgError:
    return ZgError(
        f"no mix meets search.budget {cfg.budget} ({cfg.cost}) and search.limits {dict(cfg.limits)} together",
        key="search.limits",
        fix="loosen search.limits (or search.budget), or add cheaper variants",
    )


def entry(opts: dict, blocks: list, idx, delta: float) -> dict:
    """A mix as choice.json lists it: {block: option}, its totals and predicted CE delta."""
    return {
        "mix": {b: opts[b][j]["variant"] for b, j in zip(blocks, idx)},
        **totals(opts, idx),
        "predicted_ce_delta": delta,
    }


def constraint(cost: str, bound: float, got: dict, teacher: dict, table: dict | None) -> dict:
    """One constraint of the choice: its bound, the chosen mix's and the teacher's value (base included)."""
    base = base_of(cost, table)
    return {
        "bound": bound + base,
        "value": got[cost] + base,
        "teacher": teacher[cost] + base,
        "ratio": (got[cost] + base) / (teacher[cost] + base) if teacher[cost] + base else None,
    }


def pool_entries(opts: dict, blocks: list, members: list, vec, cfg) -> list[dict]:
    """choice.json's pool: each member's mix, totals and why the solver put it there."""
    out = []
    for i, idx in enumerate(members):
        closest = min((hamming(idx, m) for m in members[:i]), default=None)
        why = (
            "the best mix within every constraint"
            if i == 0
            else f"the best mix differing from pool member{' 1' if i == 1 else f's 1-{i}'} in >= {cfg.diversity} "
            f"blocks (closest: {closest})"
        )
        out.append({"rank": i + 1, **entry(opts, blocks, idx, mix_key(vec, idx)[0]), "distance": closest, "why": why})
    return out


def measured(table: dict, got: dict, teacher: dict) -> dict:
    """The cost table's key and the chosen mix's predicted latency (base + blocks) against the teacher's."""
    base = base_of("latency", table)
    return {
        "table": "search/cost/table.json",
        "machine": table["machine"]["kind"],
        "workload": table["workload"],
        "phase": table["phase"],
        "predicted_ms": got["latency"] + base,
        "teacher_ms": teacher["latency"] + base,
        "kv_cache": got["kv_cache"],
        "teacher_kv_cache": teacher["kv_cache"],
    }

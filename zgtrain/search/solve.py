"""The budgeted search: one variant per block, minimizing the summed replace-one-block CE deltas.

Each block's options are its trained variants (metrics/variants/BLOCK/NAME.json: params, KV-cache bytes per
token and ce_delta) and the teacher block itself (``teacher``: its parameters and KV bytes, delta 0). The budget
counts ``search.cost``: parameters, or KV-cache bytes per token at the teacher's longest context (what windows
and dropped layers save; zgtrain/block/kv_cache.py). ``solve`` is exact: a dynamic program over the
blocks that keeps, after each block, only the partial mixes no other partial mix beats on both cost and
delta (the Pareto front). Dropping a beaten partial mix never loses the optimum, since any completion of it
completes the better one too, at no more cost and no more delta. Ties break toward the lower cost, then the
earlier options (the teacher first, then params order), so the choice is a function of the scores.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from zgdata.core.atomic import write_json
from zgdata.core.lock import project_lock
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
from zgtrain.project.workload import TABLE_COSTS
from zgtrain.search.pool import diverse_pool, hamming, mix_key
from zgtrain.search.variants import search_choice, search_metrics, stage_name, variant_metrics

__all__ = ["solve", "ranked", "min_cost", "options", "run_search", "RANKED", "SearchResult"]

RANKED = 5  # mixes listed in search/choice.json's "ranked": the best first, then the next-best feasible ones


def min_cost(choices: Sequence[Sequence[tuple[float, float]]]) -> float:
    """The cost of the cheapest mix: the smallest budget any mix fits in."""
    return sum(min(c for c, _ in opts) for opts in choices)


def solve(choices: Sequence[Sequence[tuple[float, float]]], budget: float) -> tuple[int, ...] | None:
    """Indices (one option per block) minimizing the summed delta with summed cost <= budget; None if none fits.

    ``choices[b]`` lists block b's options as (cost, delta), costs >= 0. Among mixes of equal delta the one of
    lower cost wins, then the lexicographically smaller index tuple."""
    states = [(0.0, 0.0, ())]  # (delta, cost, indices) of the partial mixes on the Pareto front
    for opts in choices:
        grown = [
            (d + od, c + oc, idx + (j,)) for d, c, idx in states for j, (oc, od) in enumerate(opts) if c + oc <= budget
        ]
        grown.sort(key=lambda s: (s[1], s[0], s[2]))
        states, best = [], math.inf
        for s in grown:  # an earlier state has cost <= this one's; keep this one only if its delta is lower
            if s[0] < best:
                states.append(s)
                best = s[0]
        if not states:
            return None
    return min(states)[2]


def _key(choices, idx: tuple[int, ...]) -> tuple:
    delta = cost = 0.0
    for b, j in enumerate(idx):  # the summation order of solve()
        cost, delta = cost + choices[b][j][0], delta + choices[b][j][1]
    return delta, cost, idx


def ranked(choices: Sequence[Sequence[tuple[float, float]]], budget: float, k: int) -> list[tuple[int, ...]]:
    """The K best mixes within the budget, best first, in ``solve``'s order (exact, Lawler's partition).

    After taking the best mix x of a space, the rest of the space splits into disjoint subspaces: for each
    block i, blocks before i fixed to x's options and block i barred from x[i]; each is solved with ``solve``."""
    import heapq

    def best(allowed):
        pick = solve([[choices[b][j] for j in allowed[b]] for b in range(len(choices))], budget)
        return None if pick is None else tuple(allowed[b][j] for b, j in enumerate(pick))

    allowed = [list(range(len(o))) for o in choices]
    first = best(allowed)
    heap = [] if first is None else [(_key(choices, first), allowed)]
    out = []
    while heap and len(out) < k:
        (_, _, x), allowed = heapq.heappop(heap)
        out.append(x)
        for i in range(len(choices)):
            sub = [[x[b]] for b in range(i)] + [[j for j in allowed[i] if j != x[i]]] + allowed[i + 1 :]
            y = best(sub) if sub[i] else None
            if y is not None:
                heapq.heappush(heap, (_key(choices, y), sub))
    return out


def options(project: ProjectConfig, layout: Layout) -> dict[str, list[dict]]:
    """{block: [{variant, params, kv_bytes, active_params, ce_delta}, ...]}, the teacher block first, from the
    variant metrics."""
    out = {}
    for block in project.blocks:
        opts = []
        for v in project.variants:
            path = variant_metrics(layout, block, v)
            try:
                m = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ZgError(f"{path} is missing or unreadable", fix=f"run `dvc repro {stage_name(block, v)}`") from e
            if (
                m.get("status") != "done"
                or "ce_delta" not in m
                or "kv_bytes_per_token" not in m
                or (m.get("block"), m.get("variant")) != (block, v)
            ):
                raise ZgError(
                    f"{path} is not the scores of a finished {block}/{v}", fix=f"run `dvc repro {stage_name(block, v)}`"
                )
            if not opts:
                opts.append(
                    {
                        "variant": IDENTITY_VARIANT,
                        "params": int(m["teacher_params"]),
                        "kv_bytes": float(m["teacher_kv_bytes_per_token"]),
                        "active_params": int(m.get("teacher_active_params", m["teacher_params"])),
                        "ce_delta": 0.0,
                    }
                )
            opts.append(
                {
                    "variant": v,
                    "params": int(m["params"]),
                    "kv_bytes": float(m["kv_bytes_per_token"]),
                    "active_params": int(m.get("active_params", m["params"])),  # a dense block runs all of them
                    "ce_delta": float(m["ce_delta"]),
                }
            )
        out[block] = opts
    return out


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The chosen mix; ``choice()`` is search/choice.json. Costs of a mix are summed over its blocks' options."""

    cost: str
    """What the budget counts: params, active_params or kv_bytes (search.cost)."""
    budget: float
    budget_unit: str
    budget_cost: float
    """The budget in units of ``cost`` (a fraction times the teacher's, or absolute)."""
    teacher_params: int
    teacher_kv_bytes: float
    teacher_active_params: int
    """The teacher blocks' parameters one token runs (a mixture of experts: all but the experts it skips)."""
    params: int
    kv_bytes: float
    """The chosen mix's KV-cache bytes per token."""
    active_params: int
    """The chosen mix's parameters one token runs (its params, for dense blocks)."""
    param_ratio: float
    kv_ratio: float
    predicted_ce_delta: float
    """The summed replace-one-block CE deltas of the chosen options."""
    blocks: dict
    """{block: the chosen option (variant, params, kv_bytes, ce_delta)}."""
    ranked: list
    """The best mixes within the budget, best first (the first is this choice)."""
    constraints: dict
    """{cost: bound, value, teacher, ratio}: search.cost's budget and each of search.limits (latency with its base)."""
    pool: list
    """The diverse pool (search.pool, search.diversity), best first: each mix, its totals and why it is there."""
    measured: dict | None
    """Where the measured cost table was used: its machine and workload, the mix's predicted latency (ms)."""
    path: str
    """search/choice.json."""

    def choice(self) -> dict:
        """search/choice.json: every field but the path."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "path"}

    def metrics(self) -> dict:
        """What `zg search run --json` prints: the choice and its path."""
        return {**self.choice(), "path": self.path}


def run_search(project: ProjectConfig, *, layout: Layout = Layout()) -> SearchResult:
    """Pick the mix, write search/choice.json and metrics/search.json (one search at a time)."""
    with project_lock(layout, "search", writes=search_choice(layout)):
        return _run(project, layout)


UNITS = {
    "params": "params",
    "active_params": "active params",
    "kv_bytes": "KV bytes/token",
    "latency": "ms",
    "kv_cache": "KV-cache bytes",
}


def _totals(opts: dict, idx) -> dict:
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
            o.update(latency=cost[phase]["median"], kv_cache=cost["kv_cache"])
    table["phase"] = phase
    return table


def _base(cost: str, table: dict | None) -> float:
    """What every mix pays besides its blocks: the embedding and head's measured latency; 0 for the rest."""
    return table["base"][table["phase"]]["median"] if cost == "latency" and table else 0.0


def _bounds(cfg, teacher: dict, table: dict | None) -> dict:
    """{cost: the blocks' bound} of every constraint (search.cost's budget first). A fraction is of the teacher's
    whole cost (for latency: base + blocks); the base comes off each bound, since every mix pays it."""
    out = {}
    for cost, bound in cfg.constraints.items():
        base = _base(cost, table)
        out[cost] = bound * (teacher[cost] + base) - base if cfg.budget_unit == "fraction" else bound - base
    return out


def _unmet_limits(cfg) -> ZgError:
    return ZgError(
        f"no mix meets search.budget {cfg.budget} ({cfg.cost}) and search.limits {dict(cfg.limits)} together",
        key="search.limits",
        fix="loosen search.limits (or search.budget), or add cheaper variants",
    )


def _entry(opts: dict, blocks: list, idx, delta: float) -> dict:
    """A mix as choice.json lists it: {block: option}, its totals and predicted CE delta."""
    return {
        "mix": {b: opts[b][j]["variant"] for b, j in zip(blocks, idx)},
        **_totals(opts, idx),
        "predicted_ce_delta": delta,
    }


def _constraint(cost: str, bound: float, got: dict, teacher: dict, table: dict | None) -> dict:
    """One constraint of the choice: its bound, the chosen mix's and the teacher's value (base included)."""
    base = _base(cost, table)
    return {
        "bound": bound + base,
        "value": got[cost] + base,
        "teacher": teacher[cost] + base,
        "ratio": (got[cost] + base) / (teacher[cost] + base) if teacher[cost] + base else None,
    }


def _pool(opts: dict, blocks: list, members: list, vec, cfg) -> list[dict]:
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
        out.append({"rank": i + 1, **_entry(opts, blocks, idx, mix_key(vec, idx)[0]), "distance": closest, "why": why})
    return out


def _measured(table: dict, got: dict, teacher: dict) -> dict:
    """The cost table's key and the chosen mix's predicted latency (base + blocks) against the teacher's."""
    base = _base("latency", table)
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


_METRICS = (
    "cost",
    "budget_cost",
    "teacher_params",
    "teacher_kv_bytes",
    "teacher_active_params",
    "params",
    "kv_bytes",
    "active_params",
    "param_ratio",
    "kv_ratio",
    "predicted_ce_delta",
)
"""The chosen mix's figures that metrics/search.json keeps (with the candidates, the uniform mixes, the choice)."""


def _over_budget(cfg, choices, budget: float, full: float, unit: str, base: float = 0.0) -> ZgError:
    """The refusal of a budget below the cheapest mix, naming the smallest budget that has one (``base``: what
    every mix pays besides its blocks, the measured latency's embedding and head)."""
    least, budget, full = min_cost(choices) + base, budget + base, full + base
    smallest = (
        f"{math.ceil(least / full * 1e4) / 1e4} (budget_unit: fraction)"
        if cfg.budget_unit == "fraction"
        else f"{math.ceil(least * 1e4) / 1e4:g} (budget_unit: absolute)"
    )
    return ZgError(
        f"search.budget {cfg.budget} ({budget:,.0f} {unit}, search.cost: {cfg.cost}) is below the "
        f"cheapest mix of the variant library ({least:,.0f} {unit}, {least / full:.4f} of the "
        f"teacher's {full:,.0f})",
        key="search.budget",
        fix=f"set search.budget >= {smallest}, or add cheaper variants",
    )


def _run(project: ProjectConfig, layout: Layout) -> SearchResult:
    cfg = project.search
    if not project.variants:
        raise ZgError(
            "params.yaml has no variant library to search",
            key="variants",
            fix="add a variants: section (see `zg init --profile tiny-search`) and run `zg pipeline`",
        )
    opts = options(project, layout)
    table = with_table(project, layout, opts) if cfg.measured else None
    blocks = list(opts)
    choices = [[(o[cfg.cost], o["ce_delta"]) for o in opts[b]] for b in blocks]
    teacher = _totals(opts, [0] * len(blocks))
    full, unit = teacher[cfg.cost], UNITS[cfg.cost]
    bounds = _bounds(cfg, teacher, table)
    budget = bounds[cfg.cost]
    if min_cost(choices) > budget:
        raise _over_budget(cfg, choices, budget, full, unit, _base(cfg.cost, table))
    names = list(bounds)  # search.cost first, then search.limits
    vec = [[(tuple(o[c] for c in names), o["ce_delta"]) for o in opts[b]] for b in blocks]
    members = diverse_pool(vec, [bounds[c] for c in names], cfg.pool, cfg.diversity)
    if not members:
        raise _unmet_limits(cfg)
    pick = members[0]
    chosen = {b: opts[b][j] for b, j in zip(blocks, pick)}
    # the next-best feasible mixes, for the loop that tries another mix when the assembled one fails a gate
    best = ranked(choices, budget, RANKED) if len(names) == 1 else diverse_pool(vec, list(bounds.values()), RANKED)
    alternatives = [_entry(opts, blocks, idx, _key(choices, idx)[0]) for idx in best]
    got = _totals(opts, pick)
    choice = {
        "cost": cfg.cost,
        "budget": cfg.budget,
        "budget_unit": cfg.budget_unit,
        "budget_cost": budget,
        "teacher_params": teacher["params"],
        "teacher_kv_bytes": teacher["kv_bytes"],
        "teacher_active_params": teacher["active_params"],
        **{k: got[k] for k in ("params", "kv_bytes", "active_params")},
        "param_ratio": got["params"] / teacher["params"],
        "kv_ratio": got["kv_bytes"] / teacher["kv_bytes"],
        "predicted_ce_delta": sum(o["ce_delta"] for o in chosen.values()),
        "blocks": chosen,
        "ranked": alternatives,
        "constraints": {c: _constraint(c, bounds[c], got, teacher, table) for c in names},
        "pool": _pool(opts, blocks, members, vec, cfg),
        "measured": None if table is None else _measured(table, got, teacher),
    }
    metrics = _metrics(project, opts, choice, len(members))
    result = SearchResult(**choice, path=str(search_choice(layout)))
    write_json(search_choice(layout), result.choice())
    write_json(search_metrics(layout), metrics)
    return result


def _metrics(project: ProjectConfig, opts: dict, choice: dict, pool: int) -> dict:
    """metrics/search.json: the choice's figures, the library's size, the uniform mixes (one variant everywhere:
    what the study compares the searched mix against) and the choice."""
    blocks = list(opts)
    uniform = {
        v: {**_totals(opts, [j] * len(blocks)), "predicted_ce_delta": sum(opts[b][j]["ce_delta"] for b in blocks)}
        for j, v in enumerate(project.variants, start=1)
    }
    return {
        **{k: choice[k] for k in _METRICS},
        "candidates": sum(len(o) for o in opts.values()),
        "mixes": math.prod(len(o) for o in opts.values()),
        "uniform": uniform,
        "choice": {b: o["variant"] for b, o in choice["blocks"].items()},
        "pool": pool,
    }

"""The budgeted search: one variant per block, minimizing the summed replace-one-block CE deltas.

Each block's options are its trained variants (metrics/variants/BLOCK/NAME.json: params, KV-cache bytes per
token and ce_delta) and the teacher block itself (``teacher``: its parameters and KV bytes, delta 0). The budget
counts ``search.cost``: parameters, or KV-cache bytes per token at the teacher's longest context (what windows
and dropped layers save; zgtrain/block/kv_cache.py). ``solve`` is exact: a dynamic program over the
blocks that keeps, after each block, only the partial mixes no other partial mix beats on both cost and
delta (the Pareto front). Dropping a beaten partial mix never loses the optimum, since any completion of it
completes the better one too, at no more cost and no more delta. Ties break toward the lower cost, then the
earlier options (the teacher first, then params order), so the choice is a function of the scores.

``run_search`` solves under search.cost's budget and every search.limits bound at once, and returns the pool of
search.pool mixes at least search.diversity blocks apart (zgtrain/search/pool.py: the same program over cost
vectors, exact, its complexity stated there); with one constraint and the default pool (5, 1) the choice and the
ranked list are ``solve``'s and ``ranked``'s. latency and kv_cache come from the measured cost table
(zgtrain/search/cost.py); the records it writes are zgtrain/search/mixes.py's.
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
from zgtrain.search.mixes import (
    base_of,
    bounds,
    constraint,
    entry,
    measured,
    pool_entries,
    totals,
    unmet_limits,
    with_table,
)
from zgtrain.search.pool import diverse_pool
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

    def amount(x: float) -> str:  # counts as integers; milliseconds (a measured latency) to 4 significant digits
        return f"{x:.4g}" if unit == "ms" else f"{x:,.0f}"

    limit = cfg.limits.get(cfg.cost)  # search.limits on search.cost binds when it is the tighter (constraints)
    key, value = (
        ("search.budget", cfg.budget) if limit is None or limit >= cfg.budget else (f"search.limits.{cfg.cost}", limit)
    )
    return ZgError(
        f"{key} {value} ({amount(budget)} {unit}, search.cost: {cfg.cost}) is below the "
        f"cheapest mix of the variant library ({amount(least)} {unit}, {least / full:.4f} of the "
        f"teacher's {amount(full)})",
        key=key,
        fix=f"set {key} >= {smallest}, or add cheaper variants",
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
    teacher = totals(opts, [0] * len(blocks))
    full, unit = teacher[cfg.cost], UNITS[cfg.cost]
    bound = bounds(cfg, teacher, table)
    budget = bound[cfg.cost]
    if min_cost(choices) > budget:
        raise _over_budget(cfg, choices, budget, full, unit, base_of(cfg.cost, table))
    names = list(bound)  # search.cost first, then search.limits
    vec = [[(tuple(o[c] for c in names), o["ce_delta"]) for o in opts[b]] for b in blocks]
    members = diverse_pool(vec, [bound[c] for c in names], cfg.pool, cfg.diversity)
    if not members:
        raise unmet_limits(cfg)
    pick = members[0]
    chosen = {b: opts[b][j] for b, j in zip(blocks, pick)}
    # the next-best feasible mixes, listed in choice.json (the loop that tries another mix when the assembled one
    # fails a gate reads "pool", below; "ranked" only in a choice.json written before it)
    best = ranked(choices, budget, RANKED) if len(names) == 1 else diverse_pool(vec, list(bound.values()), RANKED)
    alternatives = [entry(opts, blocks, idx, _key(choices, idx)[0]) for idx in best]
    got = totals(opts, pick)
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
        "constraints": {c: constraint(c, bound[c], got, teacher, table) for c in names},
        "pool": pool_entries(opts, blocks, members, vec, cfg),
        "measured": None if table is None else measured(table, got, teacher),
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
        v: {
            **{k: None if x == math.inf else x for k, x in totals(opts, [j] * len(blocks)).items()},
            "predicted_ce_delta": sum(opts[b][j]["ce_delta"] for b in blocks),
        }
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

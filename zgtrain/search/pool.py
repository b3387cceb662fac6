"""Several constraints at once and a pool of diverse mixes: solve.py's exact dynamic program over cost vectors.

``choices[b]`` lists block b's options as (costs, delta): ``costs`` a tuple of m non-negative costs (params,
latency, KV bytes, ...), ``budgets`` one bound per cost. A mix is feasible when every summed cost is within its
bound; the best feasible mix has the least summed delta, then the lexicographically least summed costs, then the
lexicographically least index tuple (with one cost: solve.py's order exactly).

``solve_multi`` keeps, after each block, only the partial mixes that no other partial mix *dominates*: no more
delta and no more of any cost (and, when delta and every cost are equal, an earlier index tuple). A dominated
partial mix is never needed: any completion of it completes its dominator too, feasible whenever it is, and the
dominator's completion sorts before it in the order above (float sums are monotone, so this holds bit for bit).

``diverse_pool`` is the greedy pool: the best mix, then the best mix that differs from it in at least D blocks,
then the best that differs from both, ... up to K. Each member is found exactly by the same program with one
more coordinate per earlier member: in how many blocks the partial mix differs from it, capped at D (more is
never worse, so it joins the dominance test as ">="). With D = 1 the pool is the K best mixes (solve.ranked).

Complexity. B blocks of n options, m costs, F the largest front kept after a block. Each block grows F * n
partial mixes and filters them against the kept ones: O(B * n * F^2 * (m + 1)) time, O(B * F) memory. With one
cost F is bounded by the distinct partial sums; with m costs by the product of the distinct partial sums of each
(integer costs up to C per block: F <= (B * C)^m); in the worst case F = n^B, as for any exact
multi-constraint knapsack (NP-hard). Pool member i multiplies F by at most (D + 1)^i. The search profile's
library (6 blocks x 10 options) with two constraints and a pool of 3 at distance 2 solves in about 0.1 s here;
tests/zgtrain/search/test_pool.py checks the result against enumerating every mix.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["solve_multi", "diverse_pool", "mix_key", "hamming"]

Options = Sequence[Sequence[tuple[Sequence[float], float]]]


def hamming(a: Sequence[int], b: Sequence[int]) -> int:
    """In how many blocks two mixes differ."""
    return sum(x != y for x, y in zip(a, b))


def mix_key(choices: Options, idx: Sequence[int]) -> tuple:
    """(delta, *summed costs, idx) of a mix, summed block by block (the program's order): how mixes rank."""
    delta, costs = 0.0, [0.0] * len(choices[0][0][0]) if choices else []
    for b, j in enumerate(idx):
        c, d = choices[b][j]
        delta += d
        costs = [x + y for x, y in zip(costs, c)]
    return (delta, *costs, tuple(idx))


def _dominates(a: tuple, b: tuple, m: int) -> bool:
    """Partial state a = (delta, *costs, idx, diffs) dominates b: no worse anywhere (diffs: no fewer)."""
    if any(x > y for x, y in zip(a[: m + 1], b[: m + 1])):
        return False
    if any(x < y for x, y in zip(a[-1], b[-1])):
        return False
    return a[: m + 1] != b[: m + 1] or a[m + 1] <= b[m + 1]


def solve_multi(
    choices: Options, budgets: Sequence[float], avoid: Sequence[Sequence[int]] = (), distance: int = 1
) -> tuple[int, ...] | None:
    """The best feasible mix (indices, one option per block) that differs from every mix of ``avoid`` in at least
    ``distance`` blocks; None if there is none. See the module docstring for the order and the complexity."""
    m, cap = len(budgets), distance
    states = [(0.0, *([0.0] * m), (), tuple(0 for _ in avoid))]  # (delta, *costs, idx, diffs per avoided mix)
    for b, opts in enumerate(choices):
        grown = []
        for s in states:
            for j, (oc, od) in enumerate(opts):
                costs = tuple(x + y for x, y in zip(s[1 : m + 1], oc))
                if all(c <= u for c, u in zip(costs, budgets)):
                    diffs = tuple(min(cap, d + (a[b] != j)) for d, a in zip(s[-1], avoid))
                    grown.append((s[0] + od, *costs, s[m + 1] + (j,), diffs))
        grown.sort(key=lambda s: s[: m + 2])
        states = []
        for s in grown:  # any dominator of s sorts before it; a dropped one's dominator was kept
            if not any(_dominates(k, s, m) for k in states):
                states.append(s)
        if not states:
            return None
    done = [s for s in states if all(d >= cap for d in s[-1])]
    return min(done, key=lambda s: s[: m + 2])[m + 1] if done else None


def diverse_pool(choices: Options, budgets: Sequence[float], k: int, distance: int = 1) -> list[tuple[int, ...]]:
    """Up to K feasible mixes, best first, each differing from every earlier one in at least ``distance`` blocks
    (greedy: member i is the best mix at that distance from members 0..i-1)."""
    pool: list[tuple[int, ...]] = []
    while len(pool) < k:
        nxt = solve_multi(choices, budgets, avoid=pool, distance=distance)
        if nxt is None:
            break
        pool.append(nxt)
    return pool

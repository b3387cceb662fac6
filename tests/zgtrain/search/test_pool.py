"""The multi-constraint solver and the diverse pool (zgtrain/search/pool.py), pure: checked against enumerating
every mix of small random libraries."""

from __future__ import annotations

import itertools
import random

from zgtrain.search.pool import diverse_pool, hamming, mix_key, solve_multi
from zgtrain.search.solve import ranked, solve


def _library(rng, m):
    """A random library: 1-4 blocks of 1-4 options, each with m integer-ish costs (ties on purpose)."""
    return [
        [
            (tuple(float(rng.randint(0, 9)) for _ in range(m)), rng.choice([rng.uniform(-0.2, 1.0), 0.25, 0.5]))
            for _ in range(rng.randint(1, 4))
        ]
        for _ in range(rng.randint(1, 4))
    ]


def _feasible(choices, budgets):
    """Every mix within every budget, as (delta, *costs, idx), sorted: the definition the solver must meet."""
    out = []
    for idx in itertools.product(*(range(len(o)) for o in choices)):
        key = mix_key(choices, idx)
        if all(c <= u for c, u in zip(key[1:-1], budgets)):
            out.append(key)
    return sorted(out)


def test_two_constraints_exact_against_enumeration():
    rng = random.Random(0)
    hit = 0
    for seed in range(400):
        choices = _library(rng, 2)
        budgets = (rng.uniform(0, 9 * len(choices)), rng.uniform(0, 9 * len(choices)))
        feasible = _feasible(choices, budgets)
        want = feasible[0][-1] if feasible else None
        assert solve_multi(choices, budgets) == want, (seed, choices, budgets)
        hit += want is not None
        # the second constraint binds somewhere: the one-constraint optimum is often infeasible under both
    assert 100 < hit < 400


def test_three_constraints_exact_against_enumeration():
    rng = random.Random(1)
    for _ in range(200):
        choices = _library(rng, 3)
        budgets = tuple(rng.uniform(0, 9 * len(choices)) for _ in range(3))
        feasible = _feasible(choices, budgets)
        assert solve_multi(choices, budgets) == (feasible[0][-1] if feasible else None), (choices, budgets)


def test_one_constraint_is_solve_and_a_distance_one_pool_is_ranked():
    rng = random.Random(2)
    for _ in range(200):
        choices = _library(rng, 1)
        budget = rng.uniform(0, 9 * len(choices))
        flat = [[(c[0], d) for c, d in opts] for opts in choices]
        assert solve_multi(choices, (budget,)) == solve(flat, budget)
        k = rng.randint(1, 6)
        assert diverse_pool(choices, (budget,), k, 1) == ranked(flat, budget, k)


def test_the_pool_is_the_greedy_diverse_choice_by_enumeration():
    rng = random.Random(3)
    sizes = []
    for _ in range(300):
        choices = _library(rng, 2)
        budgets = (rng.uniform(0, 9 * len(choices)), rng.uniform(0, 9 * len(choices)))
        k, d = rng.randint(1, 5), rng.randint(1, 3)
        want = []
        for key in _feasible(choices, budgets):  # best first: take each mix far enough from those taken
            if len(want) < k and all(hamming(key[-1], w) >= d for w in want):
                want.append(key[-1])
        got = diverse_pool(choices, budgets, k, d)
        assert got == want, (choices, budgets, k, d)
        assert all(hamming(a, b) >= d for a, b in itertools.combinations(got, 2))
        sizes.append(len(got))
    assert max(sizes) == 5 and min(sizes) == 0  # the cases cover full, partial and empty pools


def test_the_search_profiles_library_size_solves_quickly_enough():
    """A library of the search profile's size (6 blocks x 10 options: the teacher and 9 variants) with two
    constraints and a pool of 3 at distance 2: the fronts stay small enough to solve here (no timing asserted)."""
    rng = random.Random(4)
    choices = [
        [((float(rng.randint(50, 100)), float(rng.randint(10, 40))), rng.uniform(0, 0.5)) for _ in range(10)]
        for _ in range(6)
    ]
    budgets = (0.7 * 6 * 100, 0.7 * 6 * 40)
    pool = diverse_pool(choices, budgets, 3, 2)
    assert len(pool) == 3 and pool[0] == solve_multi(choices, budgets)
    assert all(hamming(a, b) >= 2 for a, b in itertools.combinations(pool, 2))
    for idx in pool:
        assert all(c <= u for c, u in zip(mix_key(choices, idx)[1:-1], budgets))

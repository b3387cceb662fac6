"""The cost table's arithmetic (zgtrain/search/cost.py, zgtrain/search/llamacpp.py), pure: per-block sums of
per-layer timings, the base, the prediction of a mix and llama.cpp's split of whole-model timings."""

from __future__ import annotations

import random
import statistics

import pytest

from zgtrain.search.cost import base_cost, block_costs, normalize_runs, phases, predict, round_robin, stats, table_rows
from zgtrain.search.llamacpp import split_uniform
from zgtrain.search.table import clamped_runs


def _runs(rng, layers: int, base: tuple[float, float], n: int = 5) -> list[dict]:
    """Synthetic timed runs: per-layer seconds, and totals = layers + a base (prefill, decode) + noise."""
    out = []
    for _ in range(n):
        pre = [rng.uniform(1e-3, 2e-3) for _ in range(layers)]
        dec = [rng.uniform(1e-3, 2e-3) for _ in range(layers)]
        out.append(
            {
                "prefill": pre,
                "decode": dec,
                "prefill_total": sum(pre) + base[0] + rng.uniform(0, 1e-4),
                "decode_total": sum(dec) + base[1] + rng.uniform(0, 1e-4),
            }
        )
    return out


def test_stats_are_median_range_and_spread():
    s = stats([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"]) == (2.5, 1.0, 10.0) and s["spread"] == 9.0 / 2.5
    assert stats([0.0, 0.0])["spread"] == 0.0


def test_block_costs_sum_their_layers_per_run_and_phases_are_ms():
    rng = random.Random(0)
    runs = _runs(rng, 5, (0.004, 0.002))
    generate = 4
    spans = {"b00": (0, 2), "b01": (2, 5)}
    got = block_costs(runs, spans, generate)
    for b, (s, e) in spans.items():
        pre = [1e3 * sum(r["prefill"][s:e]) for r in runs]
        dec = [1e3 * sum(r["decode"][s:e]) / generate for r in runs]
        req = [1e3 * (sum(r["prefill"][s:e]) + sum(r["decode"][s:e])) for r in runs]
        assert got[b]["prefill_ms"]["median"] == statistics.median(pre)
        assert got[b]["decode_ms"]["median"] == statistics.median(dec)
        assert got[b]["request_ms"]["median"] == pytest.approx(statistics.median(req), rel=1e-12)
    base = base_cost(runs, generate)
    want = statistics.median([1e3 * (r["prefill_total"] - sum(r["prefill"])) for r in runs])
    assert base["prefill_ms"]["median"] == pytest.approx(want, rel=1e-12)
    assert 4.0 <= base["prefill_ms"]["median"] <= 4.1 and 0.5 <= base["decode_ms"]["median"] <= 0.53


def test_predict_is_the_base_plus_the_chosen_options():
    table = {
        "base": {"request_ms": {"median": 1.5}},
        "blocks": {
            "b00": {"teacher": {"request_ms": {"median": 4.0}}, "p50": {"request_ms": {"median": 3.0}}},
            "b01": {"teacher": {"request_ms": {"median": 5.0}}, "p50": {"request_ms": {"median": 2.0}}},
        },
    }
    assert predict(table, {"b00": "p50", "b01": "teacher"}) == 1.5 + 3.0 + 5.0
    assert predict(table, {"b00": "teacher", "b01": "p50"}) == 1.5 + 4.0 + 2.0


def test_llama_cpp_split_recovers_base_and_layer_cost_from_whole_models():
    """Whole-model timings of a teacher of 6 layers and of its first block (2 layers) built from a known base and
    per-layer cost (plus a cold first run): the split gives back the base, per run, from the medians."""
    rng = random.Random(1)
    base, layer = {"prefill_total": 0.003, "decode_total": 0.001}, {"prefill_total": 0.002, "decode_total": 0.0015}

    def runs(n_layers):
        out = [{k: base[k] + n_layers * layer[k] + rng.uniform(0, 1e-6) for k in base} for _ in range(5)]
        out[0] = {k: 5 * v for k, v in out[0].items()}  # a cold first run, as llama.cpp's first graph
        return out

    full, first = runs(6), runs(2)
    got = split_uniform(full, first, 6, 2)
    assert len(got) == 5
    for r in got[1:]:
        for k in base:
            assert r[k] == pytest.approx(base[k], abs=1e-5)
    ms = phases([r["prefill_total"] for r in got], [r["decode_total"] for r in got], 2)
    assert ms["prefill_ms"]["median"] == pytest.approx(3.0, abs=0.01)
    with pytest.raises(ValueError):
        split_uniform(full, first, 2, 2)


def test_a_difference_below_zero_counts_as_zero_and_is_counted():
    """A block cheaper than the machine's noise: its llama.cpp cost (a difference of whole-model timings) can come
    out below 0 in some runs; each such value is 0 and the count is returned, the others are kept as they are."""
    runs = [
        {"prefill_total": -2e-5, "decode_total": 1e-5},
        {"prefill_total": 3e-5, "decode_total": -1e-6},
        {"prefill_total": 4e-5, "decode_total": 2e-5},
    ]
    got, low = clamped_runs(runs)
    assert low == 2
    assert got == [
        {"prefill_total": 0.0, "decode_total": 1e-5},
        {"prefill_total": 3e-5, "decode_total": 0.0},
        {"prefill_total": 4e-5, "decode_total": 2e-5},
    ]
    assert clamped_runs(got) == (got, 0)


def test_rows_show_what_the_runtime_cannot_run():
    ok = {"request_ms": {"median": 2.0, "spread": 0.1}, "kv_cache": 10.0}
    table = {
        "base": {"request_ms": {"median": 1.0, "spread": 0.2}},
        "blocks": {"b00": {"teacher": ok, "kv1": {"expressible": False, "why": "one head_count_kv", "kv_cache": 5.0}}},
    }
    rows = table_rows(table, "request_ms")
    assert [(r["block"], r["option"], r["ms"]) for r in rows] == [
        ("(base)", "embedding + head", 1.0),
        ("b00", "teacher", 2.0),
        ("b00", "kv1", None),
    ]
    assert rows[2]["why"] == "one head_count_kv" and rows[2]["kv_cache"] == 5.0


def test_normalize_scales_totals_and_layers_by_phase():
    runs = [
        {"prefill": [1.0, 2.0], "decode": [3.0], "prefill_total": 4.0, "decode_total": 5.0},
        {"prefill_total": 2.0, "decode_total": 1.0},
    ]
    got = normalize_runs(runs, {"prefill_total": 0.5, "decode_total": 2.0})
    assert got == [
        {"prefill_total": 2.0, "decode_total": 10.0, "prefill": [0.5, 1.0], "decode": [6.0]},
        {"prefill_total": 1.0, "decode_total": 2.0},
    ]
    assert runs[0]["prefill"] == [1.0, 2.0]  # the input is not changed


def test_round_robin_runs_each_in_turn_with_the_warm_ups_in_the_first_round():
    calls = []

    def runner(name):
        def run(warmup, repeats):
            calls.append((name, warmup, repeats))
            return [{"name": name, "n": len(calls)}]

        return run

    rounds = []
    out = round_robin({"a": runner("a"), "b": runner("b")}, 3, 2, on_round=rounds.append)
    assert calls == [("a", 2, 1), ("b", 2, 1), ("a", 0, 1), ("b", 0, 1), ("a", 0, 1), ("b", 0, 1)]
    assert [r["n"] for r in out["a"]] == [1, 3, 5] and [r["n"] for r in out["b"]] == [2, 4, 6]
    assert rounds == [0, 1, 2]


def test_the_table_charges_each_block_its_own_layers(tmp_path, monkeypatch):
    """measure_table maps each block to its own layers of the timed runs: with layer j taking j+1 ms (per run, the
    same every run) b01's cost is layers 2 and 3, not b00's 0 and 1, and each uniform model's prediction is its
    measured total exactly (additivity 0). Synthetic runs stand in for the timing; the mapping is the real code's."""
    from types import SimpleNamespace

    from zgdata.layout import Layout
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search import table as table_mod
    from zgtrain.search.cost import options

    params = profile_params("tiny-search")
    params["search"]["cost"] = "latency"
    project = ProjectConfig.from_params(params)
    keys = list(project.blocks)
    assert len(keys) >= 2
    width = 2  # layers per block here
    n_layers = width * len(keys)

    def run(option_index: int) -> dict:
        prefill = [(j + 1) * 1e-3 * (1 + option_index) for j in range(n_layers)]
        decode = [(j + 1) * 2e-3 for j in range(n_layers)]
        return {
            "prefill": prefill,
            "decode": decode,
            "prefill_total": sum(prefill) + 0.5e-3,
            "decode_total": sum(decode) + 1e-3,
        }

    opts = options(project)
    runs = {o: [run(i)] * 3 for i, o in enumerate(opts)}
    parts = {o: [(SimpleNamespace(key=k), SimpleNamespace(layers=[None] * width), None) for k in keys] for o in opts}
    monkeypatch.setattr(
        table_mod, "_timed_options", lambda project, layout: (runs, parts, {}, dict.fromkeys(opts, 1.0))
    )
    monkeypatch.setattr(table_mod, "_kv_cache", lambda *a: 0.0)
    monkeypatch.setattr("zgdata.teacher.prepare.load_slice", lambda path: (None, {"config": {}}))
    table = table_mod.measure_table(project, layout=Layout(tmp_path))
    for o in opts:
        for b, key in enumerate(keys):
            layers = range(width * b, width * (b + 1))
            want = 1e3 * sum(runs[o][0]["prefill"][j] for j in layers)
            assert table["blocks"][key][o]["prefill_ms"]["median"] == pytest.approx(want, rel=1e-12), (o, key)
            assert table["blocks"][key][o]["layers"] == width
        assert all(abs(v) < 1e-12 for v in table["models"][o]["additivity"].values()), table["models"][o]


def test_the_tables_kv_cache_holds_prompt_and_generated_tokens(tmp_path, monkeypatch):
    """A workload's context is prompt + generate, and measure_table's kv_cache (bytes) is priced at it: K and V of
    every cached token of each full-attention layer, so 32 more generated tokens add their bytes. Timing is
    synthetic; the KV arithmetic is the real code's, on a stand-in teacher config (2 KV heads of 8 float32)."""
    from types import SimpleNamespace

    from zgdata.layout import Layout
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.project.config import ProjectConfig
    from zgtrain.project.workload import WorkloadConfig
    from zgtrain.search import table as table_mod
    from zgtrain.search.cost import options

    assert WorkloadConfig(prompt=64, generate=16).context == 80
    teacher = SimpleNamespace(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        hidden_size=32,
        max_position_embeddings=512,
        dtype="float32",
    )
    monkeypatch.setattr("zgdata.teacher.prepare.load_slice", lambda path: (None, {"config": teacher}))
    width, kv_heads, head_dim, dtype_bytes, batch = 2, 2, 8, 4, 2

    def kv_of(generate: int) -> dict:
        params = profile_params("tiny-search")
        params["search"].update(cost="kv_cache", workload={"prompt": 64, "generate": generate, "batch": batch})
        project = ProjectConfig.from_params(params)
        opts, keys = options(project), list(project.blocks)
        run = {"prefill": [1e-3] * width * len(keys), "decode": [1e-3] * width * len(keys)}
        run |= {"prefill_total": sum(run["prefill"]), "decode_total": sum(run["decode"])}
        block = SimpleNamespace(
            layers=[None] * width,
            kv_heads=[None] * width,
            attention=[None] * width,
            cache_windows=lambda: [None] * width,
        )
        parts = {o: [(SimpleNamespace(key=k), block, None) for k in keys] for o in opts}
        runs = {o: [run] * 3 for o in opts}
        monkeypatch.setattr(table_mod, "_timed_options", lambda p, layout: (runs, parts, {}, dict.fromkeys(opts, 1.0)))
        table = table_mod.measure_table(project, layout=Layout(tmp_path / str(generate)))
        return {(k, o): table["blocks"][k][o]["kv_cache"] for k in keys for o in opts}

    for generate in (16, 48):
        want = 2 * width * kv_heads * head_dim * dtype_bytes * (64 + generate) * batch  # 2: a key and a value
        got = kv_of(generate)
        assert got and all(v == pytest.approx(want, rel=1e-12) for v in got.values()), (generate, want, got)

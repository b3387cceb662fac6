"""The search_cost stage: every block option timed at ``search.workload`` (zgtrain/search/cost.py says what the
table holds and how a mix is predicted from it); writes search/cost/table.json.

A shared machine's load changes between one model's timing and the next. So every option's model is timed run by
run in turn with the teacher's (two models loaded at a time), and its runs are scaled by the teacher's median over
all the stage's runs over the teacher's median in that option's window (``normalize_runs``): an option measured
while the machine was busier is not charged for it. Each option's factor is kept (``models.NAME.window``).
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from zgdata.core.atomic import write_json
from zgdata.core.progress import stderr
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
from zgtrain.search.cost import (
    PHASES,
    TOTALS,
    base_cost,
    block_costs,
    machine,
    normalize_runs,
    opened,
    options,
    phases,
    predict,
)

__all__ = ["measure_table"]

FIRST = "first-block"  # llama.cpp: the teacher cut after its first block, for the base


def _kv_cache(block, config, context: int, batch: int) -> float:
    """KV-cache bytes of ``batch`` sequences of ``context`` tokens through one block's layers."""
    from zgtrain.block.kv_cache import kv_bytes_per_token, kv_geometry, linear_state_elements

    g = kv_geometry(config)
    heads = [g["kv_heads"] if h is None else int(h) for h in block.kv_heads]
    cache_heads = [0 if a == "linear" else h for a, h in zip(block.attention, heads)]
    state = linear_state_elements(block.attention, heads, g["head_dim"])
    per_token = kv_bytes_per_token(
        block.cache_windows(),
        context=context,
        kv_heads=cache_heads,
        head_dim=g["head_dim"],
        dtype_bytes=g["dtype_bytes"],
        state_elements=state,
    )
    return per_token * context * batch


def measure_table(project: ProjectConfig, *, layout: Layout = Layout()) -> dict:
    """Time every option (a model of it in every block) on search.workload; writes search/cost/table.json."""
    from zgdata.teacher.prepare import load_slice

    w = project.search.served
    if w.runtime == "llama.cpp" and w.batch != 1:
        raise ZgError(
            f"search.workload.batch is {w.batch}: the llama.cpp runtime times one sequence",
            key="search.workload.batch",
            fix="use batch: 1 with runtime: llama.cpp",
        )
    if w.runtime == "llama.cpp" and len(project.blocks) < 2:  # before any option is timed
        raise ZgError(
            f"partition.boundaries {project.partition.boundaries} makes one block: the llama.cpp runtime prices "
            "the base (embedding and head) as the teacher less its first block, which is then the whole teacher",
            key="partition.boundaries",
            fix="split the teacher into two blocks or more, or use search.workload.runtime: torch",
        )
    started = time.perf_counter()
    teacher_config = load_slice(layout.teacher_head)[1]["config"]
    runs, parts, why, factors = _timed_options(project, layout)
    if w.runtime == "llama.cpp":
        blocks, base = _llama_blocks(project, runs, parts, why, teacher_config)
    else:
        blocks = {b: {} for b in project.blocks}
        for option in options(project):
            i = 0
            for spec, block, _ in parts[option]:
                n = len(block.layers)
                cost = block_costs(runs[option], {spec.key: (i, i + n)}, w.generate)[spec.key]
                blocks[spec.key][option] = {
                    **cost,
                    "layers": n,
                    "kv_cache": _kv_cache(block, teacher_config, w.context, w.batch),
                }
                i += n
        base = base_cost(runs[IDENTITY_VARIANT], w.generate)
    models = {}
    for option in options(project):  # the sum's check: each uniform model's prediction against its own total
        if option not in runs:
            models[option] = {"measured": None, "why": why[option]}
            continue
        m = models[option] = {"measured": _totals(runs[option], w.generate), "window": factors[option]}
        mix = dict.fromkeys(project.blocks, option)
        m["predicted"] = {p: predict({"base": base, "blocks": blocks}, mix, p) for p in PHASES}
        m["additivity"] = {p: m["measured"][p]["median"] / m["predicted"][p] - 1 for p in PHASES}
    table = {
        "machine": machine(w.runtime, w.threads),
        "workload": w.as_dict(),
        "base": base,
        "blocks": blocks,
        "models": models,
        "seconds": time.perf_counter() - started,
    }
    path = layout.search_cost_table
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, table)
    return table


def _totals(runs: list[dict], generate: int) -> dict:
    return phases([r["prefill_total"] for r in runs], [r["decode_total"] for r in runs], generate)


def _build(project: ProjectConfig, layout: Layout, option: str):
    """(parts, model, summary) of the model with ``option`` in every block (FIRST: the teacher's first block)."""
    from zgtrain.search.assemble import mix_blocks
    from zgtrain.student.assemble import build_from_blocks

    name = IDENTITY_VARIANT if option == FIRST else option
    parts = mix_blocks(project, dict.fromkeys(project.blocks, name), layout, boundaries=False)
    parts = parts[:1] if option == FIRST else parts
    model, summary = build_from_blocks(parts, layout=layout)
    return parts, model, summary


def _timed_options(project: ProjectConfig, layout: Layout) -> tuple[dict, dict, dict, dict]:
    """{option: runs normalized to the teacher}, {option: parts}, {option: why it cannot run}, {option: factor}:
    each option's model timed run by run in turn with the teacher's (the teacher alone for itself)."""
    import tempfile

    w = project.search.served
    names = [*options(project), *([FIRST] if w.runtime == "llama.cpp" else [])]
    raw, windows, parts, why = {}, {}, {}, {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zg-cost-")))
        parts[IDENTITY_VARIANT], model, summary = _build(project, layout, IDENTITY_VARIANT)
        if w.context > model.config.max_position_embeddings:
            raise ZgError(
                f"search.workload: prompt + generate = {w.context} tokens, past the teacher's "
                f"{model.config.max_position_embeddings}",
                key="search.workload.prompt",
                fix="shorten search.workload.prompt or generate",
            )
        run_t = stack.enter_context(opened(model, summary, w, tmp / IDENTITY_VARIANT, layout))
        if isinstance(run_t, str):
            raise ZgError(f"the teacher cannot run on {w.runtime}: {run_t}", key="search.workload.runtime")
        stderr.print(f"search cost: timing {IDENTITY_VARIANT} on {w.runtime} x{w.repeats}")
        raw[IDENTITY_VARIANT] = windows[IDENTITY_VARIANT] = run_t(w.warmup, w.repeats)
        for name in names[1:]:
            parts[name], model, summary = _build(project, layout, name)
            stderr.print(f"search cost: timing {name} ({summary['layers']} layers) on {w.runtime}, beside the teacher")
            with opened(model, summary, w, tmp / name, layout) as run_o:
                if isinstance(run_o, str):
                    why[name] = run_o
                    continue
                raw[name], windows[name] = [], []
                for i in range(w.repeats):
                    windows[name] += run_t(0, 1)
                    raw[name] += run_o(w.warmup if i == 0 else 0, 1)
            del model
    everything = [r for runs in windows.values() for r in runs]
    ref = {k: statistics.median(r[k] for r in everything) for k in TOTALS}
    factors = {n: {k: ref[k] / statistics.median(r[k] for r in windows[n]) for k in TOTALS} for n in raw}
    return {n: normalize_runs(raw[n], factors[n]) for n in raw}, parts, why, factors


def _llama_blocks(project: ProjectConfig, runs: dict, parts: dict, why: dict, teacher_config: dict):
    """llama.cpp: the base from the teacher and its first block (zgtrain/search/llamacpp.py ``split_uniform``),
    each uniform model's rest spread over its blocks by layer count; an option export refused is recorded so."""
    from zgtrain.search.llamacpp import split_uniform

    w = project.search.served
    n = {o: sum(len(b.layers) for _, b, _ in p) for o, p in parts.items()}
    base_runs, base_clamped = clamped_runs(
        split_uniform(runs[IDENTITY_VARIANT], runs.pop(FIRST), n[IDENTITY_VARIANT], n[FIRST])
    )
    base_s = {k: statistics.median(r[k] for r in base_runs) for k in TOTALS}
    blocks = {b: {} for b in project.blocks}
    for option in options(project):
        for spec, block, _ in parts[option]:
            share = len(block.layers) / n[option]
            cost = {"layers": len(block.layers), "kv_cache": _kv_cache(block, teacher_config, w.context, w.batch)}
            if option in runs:
                own, clamped = clamped_runs([{k: (r[k] - base_s[k]) * share for k in TOTALS} for r in runs[option]])
                cost.update(_totals(own, w.generate), **({"clamped_runs": clamped} if clamped else {}))
            else:
                cost.update(expressible=False, why=why[option])
            blocks[spec.key][option] = cost
    return blocks, {**_totals(base_runs, w.generate), **({"clamped_runs": base_clamped} if base_clamped else {})}


def clamped_runs(runs: list[dict]) -> tuple[list[dict], int]:
    """Runs with each phase's seconds at least 0, and how many values were below. llama.cpp's costs are
    differences of whole-model timings; where a block costs less than the machine's noise, a difference can come
    out below zero. A cost is never negative (the solver's pruning needs costs >= 0 to stay exact, pool.py), so
    such a value counts as 0, and the table says how many there were."""
    low = sum(r[k] < 0 for r in runs for k in TOTALS)
    return [{k: max(0.0, r[k]) for k in TOTALS} for r in runs], low

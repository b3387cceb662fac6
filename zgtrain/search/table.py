"""The search_cost stage: every block option timed at ``search.workload`` (zgtrain/search/cost.py says what the
table holds and how a mix is predicted from it); writes search/cost/table.json."""

from __future__ import annotations

import time

from zgdata.core.atomic import write_json
from zgdata.core.progress import stderr
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
from zgtrain.search.cost import PHASES, base_cost, block_costs, options, phases, predict

__all__ = ["measure_table"]


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


def _timed(model, fam, w) -> list[dict]:
    from zgtrain.search.measure import timed_runs

    return timed_runs(
        model,
        fam.layers(model),
        batch=w.batch,
        prompt=w.prompt,
        generate=w.generate,
        warmup=w.warmup,
        repeats=w.repeats,
        threads=w.threads,
    )


def measure_table(project: ProjectConfig, *, layout: Layout = Layout()) -> dict:
    """Time every option (a model of it in every block) on search.workload; writes search/cost/table.json."""
    from zgdata.teacher.prepare import load_slice
    from zgtrain.search.measure import machine

    w = project.search.served
    if w.runtime != "torch":
        raise ZgError(
            f"search.workload.runtime {w.runtime!r}: only the torch runtime is measured so far",
            key="search.workload.runtime",
            fix="use runtime: torch (the llama.cpp runtime is not built yet)",
        )
    started = time.perf_counter()
    teacher_config = load_slice(layout.teacher_head)[1]["config"]
    blocks, models, base = {b: {} for b in project.blocks}, {}, None
    for option in options(project):
        runs, blocks_of = _time_option(project, layout, option, teacher_config)
        for b, cost in blocks_of.items():
            blocks[b][option] = cost
        if option == IDENTITY_VARIANT:
            base = base_cost(runs, w.generate)
        totals = [r["prefill_total"] for r in runs], [r["decode_total"] for r in runs]
        models[option] = {"measured": phases(*totals, w.generate)}
    for option, m in models.items():  # the sum's check: each uniform model's prediction against its own total
        table = {"base": base, "blocks": blocks}
        mix = dict.fromkeys(project.blocks, option)
        m["predicted"] = {p: predict(table, mix, p) for p in PHASES}
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


def _time_option(project: ProjectConfig, layout: Layout, option: str, teacher_config: dict) -> tuple[list, dict]:
    """The timed runs of a model with ``option`` in every block, and {block: its costs} from them."""
    from zgdata.families.registry import family_of
    from zgtrain.search.assemble import mix_blocks
    from zgtrain.student.assemble import build_from_blocks

    w = project.search.served
    parts = mix_blocks(project, dict.fromkeys(project.blocks, option), layout, boundaries=False)
    model, summary = build_from_blocks(parts, layout=layout)
    longest = model.config.max_position_embeddings
    if w.context > longest:
        raise ZgError(
            f"search.workload: prompt + generate = {w.context} tokens, past the teacher's {longest}",
            key="search.workload.prompt",
            fix="shorten search.workload.prompt or generate",
        )
    stderr.print(f"search cost: timing {option} ({summary['layers']} layers) x{w.repeats}")
    runs = _timed(model, family_of(teacher_config), w)
    out, i = {}, 0
    for spec, block, _ in parts:
        n = len(block.layers)
        out[spec.key] = {
            **block_costs(runs, {spec.key: (i, i + n)}, w.generate)[spec.key],
            "layers": n,
            "kv_cache": _kv_cache(block, teacher_config, w.context, w.batch),
        }
        i += n
    return runs, out

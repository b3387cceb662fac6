"""The stages of a project's variant library and its budgeted search (params variants:, search:): one
variant@BLOCK-NAME stage per (block, variant), then search, search_assemble, and search_cost / search_repair where
params asks for them. zgtrain.pipeline.stages adds them to dvc.yaml."""

from __future__ import annotations

from pathlib import Path

from zgdata.layout import Layout
from zgtrain.project.config import ProjectConfig, TrainConfig
from zgtrain.project.eval_sets import literal_paths
from zgtrain.project.sections import RepairConfig, SearchConfig

__all__ = ["search_stages"]


def search_stages(project: ProjectConfig, blocks, code) -> dict:
    """variant@BLOCK-NAME per (block, variant), search and search_assemble: only where params has a variant library.

    Each variant stage depends on its own ``variants.NAME`` entry (plus ``seed`` and the ``train:`` defaults it
    inherits), so editing one variant reruns only its stages. Its scores run the downstream teacher blocks, so
    every teacher slice is a dep (they change together, with the teacher stage). With repair.steps > 0,
    search_repair repairs the kept mix and judges it again."""
    L = Layout(Path(""))
    names = list(project.variants)
    runs = {
        f"{b.key}-{v}": {"block": b.key, "variant": v, "in": b.input, "out": b.output} for b in blocks for v in names
    }
    out = {
        "variant": {"foreach": runs, "do": _variant_stage(L, blocks, code)},
        "search": {
            "cmd": "zg search run",
            "deps": [str(L.variant_metrics(b.key, v)) for b in blocks for v in names] + code("search"),
            "params": SearchConfig.stage_keys(without=("max_tries",)),  # search_assemble's only
            "outs": [{str(L.search_choice): {"cache": False}}],
            "metrics": [{str(L.search_metrics): {"cache": False}}],
        },
        # the chosen mix as a student, judged on the eval sets (the next-best mixes when it fails a gate); which
        # variant folders it reads depends on the choice, so it lists all
        "search_assemble": {
            "cmd": "zg search assemble",
            "deps": [str(L.search_choice)]
            + [str(L.variant_dir(b.key, v)) for b in blocks for v in names]
            + [str(L.teacher_slice(b.key)) for b in blocks]
            + [str(L.teacher_head), str(L.teacher_hf), str(L.teacher_json), str(L.tokens), str(L.tokens_json)]
            + code("search_assemble")
            + literal_paths(project.eval.sets),
            "params": ["partition", "eval", "gates", "search.max_tries"],
            "outs": [str(L.search_student)],
            "metrics": [{str(L.search_eval_metrics): {"cache": False}}],
        },
    }
    if project.search.measured:  # latency / kv_cache: the measured cost table, its own stage
        out["search_cost"] = _search_cost_stage(project, L, blocks, code)
        out["search"]["deps"].insert(0, str(L.search_cost_table))
        out["search_assemble"]["deps"].insert(1, str(L.search_cost_table))
    if project.repair.enabled:  # global distillation of the kept mix (zgtrain/search/repair.py)
        out["search_repair"] = _search_repair_stage(L, blocks, out["search_assemble"], code)
    return out


def _search_cost_stage(project: ProjectConfig, L: Layout, blocks, code) -> dict:
    """search_cost: every option timed at search.workload (zgtrain/search/cost.py). It reruns when the workload
    (its runtime included) or a variant (its params or its trained folder) changes, never for the budget."""
    names = list(project.variants)
    return {
        "cmd": "zg search costs --measure",
        "deps": [str(L.variant_dir(b.key, v)) for b in blocks for v in names]
        + [str(L.teacher_slice(b.key)) for b in blocks]
        + [str(L.teacher_head), str(L.teacher_json), str(L.teacher_hf)]  # hf: the tokenizer of a GGUF (llama.cpp)
        + code("search_cost"),
        "params": ["search.workload", "variants"],  # `zg pipeline` writes search.workload where it lacks it
        "outs": [{str(L.search_cost_table): {"cache": False}}],
    }


def _variant_stage(L: Layout, blocks, code) -> dict:
    """variant@BLOCK-NAME's body: one block trained as one variant, then scored."""
    item = ("${item.block}", "${item.variant}")
    return {
        "cmd": "zg train variant ${item.block} ${item.variant}",
        "deps": [
            str(L.boundary("${item.in}")),
            str(L.boundary("${item.out}")),
            str(L.tokens),
            str(L.tokens_json),
            str(L.teacher_head),
        ]
        + [str(L.teacher_slice(b.key)) for b in blocks]
        + code("variant"),
        "params": ["seed", *TrainConfig.stage_keys(), "variants.${item.variant}"],
        "outs": [str(L.variant_dir(*item))],
        "metrics": [{str(L.variant_metrics(*item)): {"cache": False}}],
        "plots": [{str(L.variant_loss_curve(*item)): {"cache": False, "x": "step", "y": "loss"}}],
    }


def _search_repair_stage(L: Layout, blocks, search_assemble: dict, code) -> dict:
    """search_repair: the kept mix repaired, then judged again."""
    rp = L.search_repair
    return {
        "cmd": "zg search repair",
        # the kept mix, the report naming it, what repair reads, and what judging reads (the init weights too)
        "deps": list(
            dict.fromkeys(
                [str(L.search_student), str(L.search_eval_metrics), str(L.boundary(blocks[-1].output))]
                + search_assemble["deps"][1:]
                + code("search_repair")
            )
        ),
        "params": [
            "seed",
            *RepairConfig.stage_keys(),
            "partition",
            "eval",
            "gates",
        ],  # search_assemble's, less max_tries
        "outs": [str(rp.run_dir), str(rp.model)],
        "metrics": [{str(rp.metrics): {"cache": False}}],
        "plots": [{str(rp.loss_curve): {"cache": False, "x": "step", "y": "loss"}}],
    }

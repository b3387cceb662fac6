"""The code each stage runs, by stage: listed as a stage's deps only in a checkout of ZeroGraph itself
(``code_deps=True``), so that an edit of a module reruns the stages that run it. tests/test_stage_deps.py traces
each stage's reads and checks them against this table."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CODE"]

# Code each stage runs, listed as deps only in a checkout of ZeroGraph itself (codedeps_=True).
CODE = {
    "teacher": [
        "zgdata/teacher/prepare.py",
        "zgdata/teacher/identity.py",
        "zgdata/teacher/source.py",
        "zgdata/teacher/tokenizer.py",
        "zgdata/families/registry.py",
    ],
    "sample": ["zgdata/tokens/sample.py", "zgdata/tokens/nucleus.py"],
    "tokens": [
        "zgdata/tokens/tokenset.py",
        "zgdata/tokens/store.py",
        "zgdata/tokens/pieces.py",
        "zgdata/tokens/corpus.py",
        "zgdata/tokens/documents.py",
        "zgdata/tokens/jsonl.py",
        "zgdata/tokens/jsonscan.py",
        "zgdata/tokens/records.py",
        "zgdata/tokens/packing.py",
        "zgdata/tokens/mix.py",
    ],
    "materialize": ["zgdata/capture_version.py", "zgdata/store/codec.py"],
    "verify": [
        "zgdata/verify.py",
        "zgdata/families/capture.py",
        "zgdata/families/widen.py",
        "zgdata/store/integrity.py",
        "zgdata/families/registry.py",
    ],
    "train": [
        "zgtrain/block/train.py",
        "zgtrain/block/model.py",
        "zgtrain/block/conversions.py",
        "zgtrain/block/objectives.py",
        "zgtrain/block/targets.py",
        "zgtrain/fit/checkpoint.py",
        "zgdata/store/reader.py",
        "zgdata/families/registry.py",
        "zgtrain/block/window.py",
        "zgtrain/block/kv_cache.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
    ],
    "assemble": [
        "zgtrain/student/assemble.py",
        "zgtrain/block/load.py",
        "zgtrain/student/load.py",
        "zgtrain/student/templates",
        "zgdata/families/registry.py",
        "zgtrain/block/window.py",
        "zgtrain/block/kv_cache.py",
        "zgtrain/student/card.py",
    ],
    "evaluate": [
        "zgtrain/evaluate/run.py",
        "zgtrain/evaluate/metrics.py",
        "zgtrain/student/load.py",
        "zgdata/families/registry.py",
        "zgtrain/block/window.py",
        "zgtrain/evaluate/sets.py",
        "zgtrain/project/eval_sets.py",
        "zgtrain/block/load.py",
        "zgtrain/evaluate/set_metrics.py",
        "zgtrain/evaluate/bootstrap.py",
        "zgtrain/evaluate/generation.py",
        "zgdata/tokens/corpus.py",
        "zgdata/tokens/documents.py",
        "zgdata/tokens/jsonl.py",
        "zgdata/tokens/jsonscan.py",
        "zgdata/tokens/records.py",
        "zgdata/families/widen.py",
        "zgtrain/student/card.py",
        "zgtrain/evaluate/gates.py",
    ],
    "local": [
        "zgtrain/local/simultaneous.py",
        "zgtrain/local/model.py",
        "zgtrain/local/schedule.py",
        "zgtrain/project/local.py",
        "zgtrain/local/sequential.py",
        "zgtrain/fit/checkpoint.py",
        "zgtrain/evaluate/metrics.py",
        "zgdata/families/registry.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
    ],
    "lm_eval": [
        "zgtrain/evaluate/lm_eval.py",
        "zgtrain/evaluate/lm_eval_task.py",
        "zgtrain/student/load.py",
        "zgdata/families/widen.py",
    ],
    "repair_eval": ["zgtrain/evaluate/repaired.py", "zgtrain/student/load.py", "zgtrain/evaluate/gates.py"],
    "repair": [
        "zgtrain/repair/train.py",
        "zgtrain/repair/model.py",
        "zgtrain/fit/checkpoint.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
        "zgtrain/student/load.py",
        "zgdata/store/reader.py",
        "zgdata/families/registry.py",
        "zgtrain/student/card.py",
    ],
}
for (
    deps_
) in CODE.values():  # zgdata/families/registry.py's parts: the adapter interface, the dense families, their traits
    if "zgdata/families/registry.py" in deps_:
        deps_ += ["zgdata/families/base.py", "zgdata/families/dense.py", "zgdata/families/traits.py"]
CODE["virtual"] = ["zgdata/materialize/virtual.py"]  # only with materialize.virtual_first (see _virtual_first)
CODE["variant"] = CODE["train"] + ["zgtrain/search/variants.py", "zgtrain/search/scores.py"]
CODE["search"] = [
    "zgtrain/search/solve.py",
    "zgtrain/search/variants.py",
    "zgtrain/search/pool.py",
    "zgtrain/search/mixes.py",
    "zgtrain/search/cost.py",
    "zgtrain/project/workload.py",
]
# search_cost (only where search.cost or search.limits names a measured cost): the uniform models built and timed
CODE["search_cost"] = list(
    dict.fromkeys(
        CODE["assemble"]
        + [
            "zgtrain/search/cost.py",
            "zgtrain/search/table.py",
            "zgtrain/search/measure.py",
            "zgtrain/search/assemble.py",
            "zgtrain/search/variants.py",
            "zgtrain/project/workload.py",
        ]
    )
)
CODE["search_assemble"] = list(
    dict.fromkeys(
        CODE["assemble"]
        + CODE["evaluate"]
        + [  # it evaluates each try
            "zgtrain/search/assemble.py",
            "zgtrain/search/judge.py",
            "zgtrain/search/variants.py",
            "zgtrain/search/cost.py",
            "zgtrain/search/measure.py",
        ]
    )
)
CODE["search_repair"] = list(dict.fromkeys(CODE["repair"] + ["zgtrain/search/repair.py"]))
# the export stage (export.enabled): the driver, the format's writer (gguf: every zgtrain/export/gguf*.py), the
# checked loader, the card and the family adapters
for fmt, writer in (
    ("hf", ["zgtrain/export/hf.py"]),
    ("gguf", [f"zgtrain/export/{p.name}" for p in sorted((Path(__file__).parents[1] / "export").glob("gguf*.py"))]),
):
    CODE[f"export_{fmt}"] = [
        "zgtrain/export/run.py",
        *writer,
        "zgtrain/student/load.py",
        "zgtrain/student/card.py",
        "zgdata/families/registry.py",
        "zgdata/families/base.py",
        "zgdata/families/dense.py",
        "zgdata/families/traits.py",
    ]
# search_cost and search_assemble export and time GGUFs where search.workload.runtime is llama.cpp
CODE["search_cost"] = list(
    dict.fromkeys(CODE["search_cost"] + ["zgtrain/search/llamacpp.py"] + CODE["export_gguf"][1:])
)
CODE["search_assemble"] = list(
    dict.fromkeys(CODE["search_assemble"] + ["zgtrain/search/llamacpp.py"] + CODE["export_gguf"][1:])
)

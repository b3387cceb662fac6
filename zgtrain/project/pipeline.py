"""One source for every dvc.yaml: the root project's and each `zg init` scaffold's.

DVC templates cannot compute k+1 or expand a list into outs, so the stage graph is
generated from params (the partition). `zg pipeline` regenerates it after the
partition changes. Each stage lists only the data, code and params keys it uses.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import yaml

from zgdata.atomic import write_text
from zgdata.config import PartitionConfig, ProjectKind, defaults, load_params, project_kind, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.evaluate.sets import literal_paths, reads_corpus
from zgtrain.local.config import LocalConfig
from zgtrain.project.config import OPTIONAL_SECTIONS, SECTIONS, ProjectConfig, SearchConfig

__all__ = [
    "PROFILES",
    "profile_params",
    "dvc_yaml",
    "write_pipeline",
    "write_dvcignore",
    "dump_params",
    "init_project",
    "regenerate",
]

# The out-of-domain set of the profiles: the only text besides the plays that the embedded packages ship.
DOCS_SET = {
    "name": "docs",
    "source": "embedded:docs",
    "format": "auto",
    "text_field": "text",
    "id_field": "id",
    "max_seqs": 0,
    "context_targets": 128,
}
# The long-context set of the search profile (issue 32): the corpus's held-out documents (never a train token) in
# rows of 2048 tokens, 4x the default corpus.seq_len (SmolLM2 takes 8192 positions). 4 rows: the 8,192 tokens of the
# smollm2 held-out split (16 x 512); rows go through the models 2 at a time (eval.batch_size 8 x 512 tokens).
LONG_SET = {
    **DOCS_SET,
    "name": "long",
    "source": "corpus:heldout",
    "max_seqs": 4,
    "context_targets": 128,
    "seq_len": 2048,
}

# A profile is a set of overrides on the config dataclasses' defaults (the one place defaults live).
PROFILES = {
    "smollm2": {
        "corpus": {"max_train_seqs": 128, "max_heldout_seqs": 16},
        "verify": {"sample": 2},
        # lossless: 0.72x the bytes of raw bf16 boundaries, same values and block bits (docs/concepts/stages.md)
        # h00 is not stored: recomputed from the tokens and the embedding, the same bits and state_sha256 (docs/concepts/stages.md)
        "materialize": {"codec": "zstd", "virtual_first": True},
        # both cores of the 2-core demo machine, as torch used before train.threads existed: the
        # demo's blocks keep their speed (25-minute budget) and the bits recorded in docs/RESULTS.md
        "train": {"threads": 2},
        # 4,062 tokens (8 rows) and 128 context windows: about 75 s more evaluate on the demo machine (estimated)
        "eval": {"sets": [DOCS_SET]},
    },
    "tiny": {
        "teacher": {"source": "random:tiny"},
        "corpus": {
            "documents": ["macbeth", "hamlet", "othello"],
            "heldout": ["macbeth"],
            "seq_len": 64,
            "max_train_seqs": 48,
            "max_heldout_seqs": 8,
        },
        "partition": {"boundaries": [0, 2, 4]},
        "materialize": {"batch_size": 8, "commit_rows": 16},
        "train": {"steps": 12, "warmup": 2, "checkpoint_every": 4},
        "eval": {
            "window": 8,
            "context_targets": 64,
            "context_min_pos": 32,
            "batch_size": 16,
            "sets": [{**DOCS_SET, "max_seqs": 16, "context_targets": 0}],
            "prompt_tokens": 16,
            "generate_tokens": 16,
        },
        # repair stays off (steps 0); these fit a 12-step repair of the tiny student when a test turns it on
        "repair": {"lr": 3e-4, "warmup": 2, "checkpoint_every": 4},
    },
    # Greedy local pretraining from scratch (zgtrain/local/simultaneous.py): the teacher gives only its tokenizer,
    # the partition cuts local.layers into K blocks. Stages: teacher, tokens, local (see dvc_yaml).
    "local": {
        "corpus": {"seq_len": 256, "max_heldout_seqs": 64},
        "partition": {"boundaries": [0, 2, 4, 6, 8]},
        "local": {},
    },
    "local-tiny": {
        "teacher": {"source": "random:tiny"},
        "corpus": {
            "documents": ["macbeth", "hamlet", "othello"],
            "heldout": ["macbeth"],
            "seq_len": 32,
            "max_train_seqs": 64,
            "max_heldout_seqs": 8,
        },
        "partition": {"boundaries": [0, 2, 4]},
        "local": {
            "layers": 4,
            "hidden": 32,
            "heads": 2,
            "kv_heads": 2,
            "intermediate": 64,
            "steps": 8,
            "batch_size": 4,
            "warmup": 2,
            "checkpoint_every": 4,
        },
    },
}
# Search profiles: the default ones plus a variant library and a budget. Variants are off unless a
# profile (or params.yaml) has a variants: section; then `zg pipeline` adds the variant@BLOCK-NAME and search stages.
PROFILES["search"] = {
    **copy.deepcopy(PROFILES["smollm2"]),
    "variants": {
        "p25": {"conversion": "prune_mlp", "prune_ratio": 0.25},
        "p50": {"conversion": "prune_mlp", "prune_ratio": 0.5},
        "p75": {"conversion": "prune_mlp", "prune_ratio": 0.75},
        "drop3": {"conversion": "drop_layers", "keep_layers": [0, 2, 4]},  # 5 teacher layers -> 3
        "drop2": {"conversion": "drop_layers", "keep_layers": [0, 4]},  # 5 teacher layers -> 2
        # attention (issue 32): the KV cache per token of the block's layers, for `search.cost: kv_bytes`
        "kv1": {"conversion": "kv_heads", "kv_heads": 1},  # SmolLM2's 3 KV heads -> 1: a third of the KV bytes
        "win128": {"conversion": "window_attention", "window": 128},  # a 128-token window: 128 of 8192 positions
        "lin": {"conversion": "attn_linear"},  # attention -> one linear map: no token mixing, 0 KV bytes
        "linattn": {"conversion": "linear_attention"},  # Hedgehog linear attention: a constant-size state, no KV cache
    },
    "search": {"budget": 0.625},
}
PROFILES["search"]["eval"] = {"sets": [DOCS_SET, LONG_SET]}  # windows and fewer KV heads judged past 512 tokens
PROFILES["tiny-search"] = {
    **copy.deepcopy(PROFILES["tiny"]),
    "variants": {
        "p50": {"conversion": "prune_mlp", "prune_ratio": 0.5, "steps": 4},
        "drop": {"conversion": "drop_layers", "keep_layers": [0], "steps": 4},
    },
    "search": {"budget": 0.75},
}


def profile_params(profile: str) -> dict:
    """params.yaml of a profile: every section's defaults with the profile's overrides, then its blocks."""
    if profile not in PROFILES:
        raise ZgError(f"unknown profile '{profile}'", fix=f"use one of {', '.join(PROFILES)}")
    over = PROFILES[profile]
    params: dict = {"seed": 0}
    for name, cls in SECTIONS.items():
        params[name] = {**defaults(cls), **copy.deepcopy(over.get(name, {}))}
    if "variants" in over:  # optional sections: only where the profile sets them (the default params stay as they were)
        params["variants"] = copy.deepcopy(over["variants"])
    for name, cls in OPTIONAL_SECTIONS.items():
        if name in over:
            params[name] = {**defaults(cls), **copy.deepcopy(over[name])}
    part = section(params, PartitionConfig)
    # blocks: carries per-block train overrides of a conversion; a local project's blocks come from the partition
    params["blocks"] = (
        {}
        if project_kind(params) is ProjectKind.LOCAL
        else {b.key: {"in": b.input, "out": b.output} for b in part.blocks()}
    )
    ProjectConfig.from_params(params)  # a profile is valid by construction; this proves it
    return params


# Code each stage runs, listed as deps only in a checkout of ZeroGraph itself (code_deps=True).
_CODE = {
    "teacher": [
        "zgdata/teacher/prepare.py",
        "zgdata/teacher/identity.py",
        "zgdata/teacher/source.py",
        "zgdata/teacher/tokenizer.py",
        "zgdata/families.py",
    ],
    "tokens": ["zgdata/tokens.py", "zgdata/corpus.py", "zgdata/packing.py"],
    "materialize": ["zgdata/capture_version.py", "zgdata/codec.py"],
    "verify": ["zgdata/verify.py", "zgdata/capture.py", "zgdata/widen.py", "zgdata/integrity.py", "zgdata/families.py"],
    "train": [
        "zgtrain/block/train.py",
        "zgtrain/block/model.py",
        "zgtrain/block/conversions.py",
        "zgtrain/block/objectives.py",
        "zgtrain/block/targets.py",
        "zgtrain/fit/checkpoint.py",
        "zgdata/reader.py",
        "zgdata/families.py",
        "zgtrain/block/window.py",
        "zgtrain/block/kv_cache.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
    ],
    "assemble": [
        "zgtrain/student/assemble.py",
        "zgtrain/student/load.py",
        "zgtrain/student/templates",
        "zgdata/families.py",
        "zgtrain/block/window.py",
        "zgtrain/block/kv_cache.py",
        "zgtrain/student/card.py",
    ],
    "evaluate": [
        "zgtrain/evaluate/run.py",
        "zgtrain/evaluate/metrics.py",
        "zgtrain/student/load.py",
        "zgdata/families.py",
        "zgtrain/block/window.py",
        "zgtrain/evaluate/sets.py",
        "zgtrain/evaluate/set_metrics.py",
        "zgtrain/evaluate/bootstrap.py",
        "zgtrain/evaluate/generation.py",
        "zgdata/corpus.py",
        "zgdata/widen.py",
        "zgtrain/student/card.py",
        "zgtrain/evaluate/gates.py",
    ],
    "local": [
        "zgtrain/local/simultaneous.py",
        "zgtrain/local/model.py",
        "zgtrain/local/schedule.py",
        "zgtrain/local/config.py",
        "zgtrain/local/sequential.py",
        "zgtrain/fit/checkpoint.py",
        "zgtrain/evaluate/metrics.py",
        "zgdata/families.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
    ],
    "lm_eval": [
        "zgtrain/evaluate/lm_eval.py",
        "zgtrain/evaluate/lm_eval_task.py",
        "zgtrain/student/load.py",
        "zgdata/widen.py",
    ],
    "repair_eval": ["zgtrain/repair/judge.py", "zgtrain/student/load.py", "zgtrain/evaluate/gates.py"],
    "repair": [
        "zgtrain/repair/train.py",
        "zgtrain/repair/model.py",
        "zgtrain/fit/checkpoint.py",
        "zgtrain/fit/loop.py",
        "zgtrain/fit/identity.py",
        "zgtrain/fit/schedule.py",
        "zgtrain/student/load.py",
        "zgdata/reader.py",
        "zgdata/families.py",
        "zgtrain/student/card.py",
    ],
}
for _deps in _CODE.values():  # zgdata/families.py's parts: the adapter interface, the dense families, their traits
    if "zgdata/families.py" in _deps:
        _deps += ["zgdata/family_base.py", "zgdata/family_dense.py", "zgdata/family_traits.py"]
_CODE["virtual"] = ["zgdata/virtual.py"]  # only with materialize.virtual_first (see _virtual_first)
_CODE["variant"] = _CODE["train"] + ["zgtrain/search/variants.py", "zgtrain/search/scores.py"]
_CODE["search"] = ["zgtrain/search/solve.py", "zgtrain/search/variants.py"]
_CODE["search_assemble"] = list(
    dict.fromkeys(
        _CODE["assemble"]
        + _CODE["evaluate"]
        + [  # it evaluates each try
            "zgtrain/search/assemble.py",
            "zgtrain/search/judge.py",
            "zgtrain/search/variants.py",
        ]
    )
)
_CODE["search_repair"] = list(dict.fromkeys(_CODE["repair"] + ["zgtrain/search/repair.py"]))
# the export stage (export.enabled): the driver, the format's writer (gguf: every zgtrain/export/gguf*.py), the
# checked loader, the card and the family adapters
for _fmt, _writer in (
    ("hf", ["zgtrain/export/hf.py"]),
    ("gguf", [f"zgtrain/export/{p.name}" for p in sorted((Path(__file__).parents[1] / "export").glob("gguf*.py"))]),
):
    _CODE[f"export_{_fmt}"] = [
        "zgtrain/export/run.py",
        *_writer,
        "zgtrain/student/load.py",
        "zgtrain/student/card.py",
        "zgdata/families.py",
        "zgdata/family_base.py",
        "zgdata/family_dense.py",
        "zgdata/family_traits.py",
    ]


def dvc_yaml(project: ProjectConfig, *, code_deps: bool, corpus_deps: list[str] = ()) -> dict:
    """PROJECT's stage graph. A conversion: teacher ... evaluate, plus the stages its params turn on (lm_eval,
    repair, the variant search, a virtual h00). Local pretraining: teacher (the tokenizer only), tokens, then
    local (or, with local.mode: sequential, local_bNN per block and local_export). ``code_deps``: list the code
    each stage runs (a checkout of ZeroGraph itself). ``corpus_deps``: the corpus files the tokens stage reads
    (zgdata/corpus.py dep_paths)."""

    def code(stage):
        return _CODE[stage] if code_deps else []

    L, blocks = Layout(Path("")), project.partition.blocks()
    stages = _conversion_stages(project, L, code)
    stages["tokens"]["deps"][2:2] = list(corpus_deps)
    if project.kind is ProjectKind.LOCAL:  # the teacher gives its tokenizer only
        stages["teacher"].update(params=["teacher"], outs=[str(L.teacher_hf), str(L.teacher_json)])
        stages = {"teacher": stages["teacher"], "tokens": stages["tokens"]} | _local_stages(project, L, blocks, code)
    else:
        _add_repair(stages, project, L, code)
        if project.variants:
            stages.update(_search_stages(project, blocks, code))
        _virtual_first(stages, project, L, code)
        _add_export(stages, project, L, code)
        if reads_corpus(project.eval.sets):  # a corpus:heldout set reads the corpus files: deps of who scores sets
            for name in ("evaluate", "search_assemble", "search_repair"):
                if name in stages:
                    stages[name]["deps"] = list(dict.fromkeys(stages[name]["deps"] + list(corpus_deps)))
    for s in stages.values():
        body = s.get("do", s)
        if not body.get("deps"):
            body.pop("deps", None)
    return {"stages": stages}


def _conversion_stages(project: ProjectConfig, L: Layout, code) -> dict:
    """A conversion's main line: teacher, tokens, materialize, verify, train@KEY, assemble, evaluate (and lm_eval
    when lm_eval.tasks names some)."""
    blocks = project.partition.blocks()
    bnd = [str(L.boundary(n)) for n in project.partition.names]
    stages = {
        "teacher": {
            "cmd": "zg teacher prepare",
            "deps": code("teacher"),
            "params": ["teacher", "partition"],
            "outs": [str(L.teacher_hf), str(L.teacher_json), str(L.teacher_head)]
            + [str(L.teacher_slice(b.key)) for b in blocks],
        },
        "tokens": {
            "cmd": "zg data tokenize",
            "deps": [str(L.teacher_json), str(L.teacher_hf)] + code("tokens"),
            "params": ["corpus"],
            "outs": [str(L.tokens), str(L.tokens_json)],
        },
        # Every file a stage reads is a dep (tests/test_stage_deps.py), so `dvc repro --pull` fetches it.
        # Rewriting a Lance dataset changes its file names, so a needless materialize rerun invalidates
        # every block. hf and tokens.lance change only when their stages rerun, and then teacher.json or
        # tokens.json has usually changed too: teacher prepare writes the same bytes from the same inputs
        # and library versions, but a forced tokenize rewrites tokens.lance and so reruns materialize.
        "materialize": {
            "cmd": "zg data materialize",
            "deps": [str(L.teacher_json), str(L.tokens_json), str(L.teacher_hf), str(L.tokens)] + code("materialize"),
            "params": [
                "materialize.storage_dtype",
                "materialize.compute_dtype",
                "materialize.codec",
                "partition.boundaries",
            ],
            "outs": bnd,
        },
        "verify": {
            "cmd": "zg data verify",
            "deps": bnd + [str(L.teacher_hf), str(L.teacher_json), str(L.tokens), str(L.tokens_json)] + code("verify"),
            "params": ["verify"],
            "metrics": [{str(L.verify_report): {"cache": False}}],
        },
        "train": {
            "foreach": "${blocks}",
            "do": {
                "cmd": "zg train block ${key}",
                "deps": [str(L.boundary("${item.in}")), str(L.boundary("${item.out}")), str(L.teacher_slice("${key}"))]
                + code("train"),
                "params": ["seed", "train", "blocks.${key}"],
                "outs": [str(L.block_dir("${key}"))],
                "metrics": [{str(L.block_metrics("${key}")): {"cache": False}}],
                "plots": [{str(L.block_loss_curve("${key}")): {"cache": False, "x": "step", "y": "loss"}}],
            },
        },
        "assemble": {
            "cmd": "zg train assemble",
            "deps": [str(L.block_dir(b.key)) for b in blocks]
            + [str(L.teacher_head), str(L.teacher_hf)]
            + [str(L.teacher_json), str(L.tokens_json)]
            + code("assemble"),
            "params": ["partition"],
            "outs": [str(L.student)],
        },
        "evaluate": {
            "cmd": "zg train evaluate",
            "deps": [str(L.student), str(L.teacher_hf), str(L.tokens)]
            + bnd
            + [str(L.block_dir(b.key)) for b in blocks]
            + [str(L.teacher_head), str(L.teacher_json), str(L.tokens_json)]
            + [str(L.block_loss_curve(b.key)) for b in blocks]
            + code("evaluate")
            + literal_paths(project.eval.sets),  # eval set files DVC can watch
            "params": ["eval", "gates"],
            "outs": [
                {str(L.generation_report): {"cache": False}},
                # persist: no run-cache restore of evaluate without running it, which would leave the student
                # folders' cards (not outputs: .dvcignore) with another run's figures (zgtrain/student/card.py)
                {str(L.model_card): {"cache": False, "persist": True}},
            ],  # the student's card + its figures, as evaluate also writes it into models/student/README.md
            "metrics": [{str(L.eval_metrics): {"cache": False}}],
            "plots": [
                {str(L.eval_ce_plot): {"cache": False, "x": "model", "y": "ce"}},
                {str(L.eval_sets_plot): {"cache": False, "x": "set", "y": "ce_gap"}},
                {str(L.eval_shift_plot): {"cache": False, "x": "block", "y": "student_input"}},
                str(L.eval_figures),
            ],
        },
    }
    if project.lm_eval.tasks:  # off unless lm_eval.tasks names some: minutes on a real teacher
        stages["lm_eval"] = {
            "cmd": "zg train lm-eval",
            "deps": [str(L.student), str(L.teacher_hf), str(L.teacher_json), str(L.tokens), str(L.tokens_json)]
            + code("lm_eval"),
            "params": ["lm_eval"],
            "outs": [str(L.lm_eval_dir)],
            "metrics": [{str(L.lm_eval_metrics): {"cache": False}}],
        }
    return stages


def _local_stages(project: ProjectConfig, L: Layout, blocks, code) -> dict:
    """Local pretraining: `local` (every block on every batch), or with local.mode: sequential one stage per
    block (input: the previous block's output dataset) and `local_export`."""
    from zgtrain.local.config import LocalConfig
    from zgtrain.local.simultaneous import NOT_IDENTITY

    data = [str(L.tokens), str(L.tokens_json), str(L.teacher_hf), str(L.teacher_json)]
    if project.local.mode != "sequential":
        return {
            "local": {
                "cmd": "zg train local",
                "deps": data + code("local"),
                "params": ["seed", "partition", "local"],
                "outs": [str(L.local_dir)],
                "metrics": [{str(L.local_metrics): {"cache": False}}],
                "plots": [{str(L.local_loss_curve): {"cache": False, "x": "step"}}],
            }
        }
    shared = [f"local.{f}" for f in defaults(LocalConfig) if f not in (*NOT_IDENTITY, "blocks")]
    bnd = [str(L.local_boundary(layer)) for layer in project.partition.boundaries]
    out = {}
    for i, b in enumerate(blocks):
        out[f"local_{b.key}"] = {
            "cmd": f"zg train local-block {b.key}",
            "deps": data + ([bnd[i]] if i else []) + code("local"),
            "params": ["seed", "partition", *shared, f"local.blocks.{b.key}"],
            "outs": [str(L.local_block_dir(b.key))] + ([bnd[i + 1]] if i < len(blocks) - 1 else []),
            "metrics": [{str(L.local_block_metrics(b.key)): {"cache": False}}],
        }
    out["local_export"] = {
        "cmd": "zg train local-export",
        "deps": data + [str(L.local_block_dir(b.key)) for b in blocks] + code("local"),
        "params": ["seed", "partition", "local.heldout_seqs", "local.eval_batch_size"],
        "outs": [str(L.local_hf)],
        "metrics": [{str(L.local_metrics): {"cache": False}}],
    }
    return out


def _search_stages(project: ProjectConfig, blocks, code) -> dict:
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
    item = ("${item.block}", "${item.variant}")
    out = {
        "variant": {
            "foreach": runs,
            "do": {
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
                "params": ["seed", "train", "variants.${item.variant}"],
                "outs": [str(L.variant_dir(*item))],
                "metrics": [{str(L.variant_metrics(*item)): {"cache": False}}],
                "plots": [{str(L.variant_loss_curve(*item)): {"cache": False, "x": "step", "y": "loss"}}],
            },
        },
        "search": {
            "cmd": "zg search run",
            "deps": [str(L.variant_metrics(b.key, v)) for b in blocks for v in names] + code("search"),
            "params": ["search"],
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
    if project.repair.enabled:  # global distillation of the kept mix (zgtrain/search/repair.py)
        rp, sa = L.search_repair, out["search_assemble"]
        out["search_repair"] = {
            "cmd": "zg search repair",
            # the kept mix, the report naming it, what repair reads, and what judging reads (the init weights too)
            "deps": list(
                dict.fromkeys(
                    [str(L.search_student), str(L.search_eval_metrics), str(L.boundary(blocks[-1].output))]
                    + sa["deps"][1:]
                    + code("search_repair")
                )
            ),
            "params": ["seed", "repair", "partition", "eval", "gates"],  # search_assemble's, less max_tries
            "outs": [str(rp.run_dir), str(rp.model)],
            "metrics": [{str(rp.metrics): {"cache": False}}],
            "plots": [{str(rp.loss_curve): {"cache": False, "x": "step", "y": "loss"}}],
        }
    return out


def _virtual_first(stages: dict, project: ProjectConfig, L: Layout, code) -> None:
    """materialize.virtual_first (zgdata/virtual.py): h00 is no output; what reads it depends on the tokens and the
    head slice (the embedding) instead. Off by default: the default pipeline is unchanged.

    DVC gives every item of a foreach the same number of deps, so the train stages iterate over a generated
    mapping with two input slots: b00's hold data/tokens.lance and the head slice, every other block's hold its
    input boundary (twice)."""
    part = project.partition
    if not (project.materialize.virtual_first and part.boundaries[0] == 0) or "train" not in stages:
        return
    h00, tokens, head = str(L.boundary(part.names[0])), str(L.tokens), str(L.teacher_head)
    mat = stages["materialize"]
    mat["outs"] = [o for o in mat["outs"] if o != h00]
    mat["params"] = mat["params"] + ["materialize.virtual_first"]
    stages["verify"]["deps"] = [d for d in stages["verify"]["deps"] if d != h00] + [head] + code("virtual")
    # evaluate reads the tokens and the head slice already
    stages["evaluate"]["deps"] = [d for d in stages["evaluate"]["deps"] if d != h00] + code("virtual")
    src = {
        b.key: (tokens, head) if b.input == part.names[0] else (str(L.boundary(b.input)),) * 2 for b in part.blocks()
    }
    train = stages["train"]
    train["foreach"] = {
        b.key: {"in": b.input, "out": b.output, "src": src[b.key][0], "aux": src[b.key][1]} for b in part.blocks()
    }
    train["do"]["deps"] = (
        ["${item.src}", "${item.aux}"] + [d for d in train["do"]["deps"] if "${item.in}" not in d] + code("virtual")
    )
    if "variant" in stages:  # a b00 variant reads the tokens and the head slice, deps of every variant already
        for run in stages["variant"]["foreach"].values():
            run["src"] = tokens if run["in"] == part.names[0] else str(L.boundary(run["in"]))
        do = stages["variant"]["do"]
        do["deps"] = ["${item.src}" if "${item.in}" in d else d for d in do["deps"]] + code("virtual")


def _add_repair(stages: dict, project: ProjectConfig, L: Layout, code) -> None:
    """The optional `repair` stage, only when repair.steps > 0: the default pipeline is unchanged.

    It reads the student, the head slice and the last boundary (the teacher's logits, no teacher forward)
    and the train tokens; evaluate then also scores models/repaired and gates the repaired model, and the
    lm_eval stage (when on) scores it too.
    """
    if not project.repair.enabled:
        return
    rp = L.repair
    stages["repair"] = {
        "cmd": "zg train repair",
        "deps": [
            str(L.student),
            str(L.teacher_head),
            str(L.boundary(project.partition.names[-1])),
            str(L.tokens),
            str(L.tokens_json),
        ]
        + code("repair"),
        "params": ["seed", "repair"],
        "outs": [str(rp.run_dir), str(rp.model)],
        "metrics": [{str(rp.metrics): {"cache": False}}],
        "plots": [{str(rp.loss_curve): {"cache": False, "x": "step", "y": "loss"}}],
    }
    for name in ("evaluate", "lm_eval"):  # the stages that score models/repaired beside the student
        if name in stages:
            st = stages.pop(name)
            st["deps"] = st["deps"][:1] + [str(rp.model)] + st["deps"][1:] + code("repair_eval")
            st["params"] = st["params"] + ["repair.steps"]
            stages[name] = st  # after repair in dvc.yaml's order


def _add_export(stages: dict, project: ProjectConfig, L: Layout, code) -> None:
    """The optional `export` stage, only when export.enabled: the default pipeline is unchanged.

    It reads the chosen student folder (and the project's teacher.json, for the tokenizer's identity) and writes
    the exported model with export.json and its card into export.out (zgtrain/export/run.py)."""
    ex = project.export
    if not ex.enabled:
        return
    owner = {"student": "assemble", "repaired": "repair", "search": "search_assemble"}[ex.student]
    if owner not in stages:
        raise ZgError(
            f"export.student is {ex.student}, but this pipeline has no {owner} stage",
            key="export.student",
            fix="set repair.steps > 0 for repaired, a variants: library for search, or export.student: student",
        )
    src = L.students[ex.student]
    stages["export"] = {
        "cmd": f"zg export {ex.student} --format {ex.format} --dtype {ex.resolved_dtype} --out {ex.out_dir}",
        "deps": [str(src), str(L.teacher_json)] + code(f"export_{ex.format}"),
        "params": ["export"],
        "outs": [ex.out_dir],
    }


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    list,
    lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", v, flow_style=all(isinstance(x, (int, float)) for x in v) and bool(v)
    ),
)

HEADER = "# Generated by `zg pipeline` from params.yaml (partition). Edit params, then rerun `zg pipeline`.\n"


def write_pipeline(root: Path, project: ProjectConfig, *, code_deps: bool) -> Path:
    path = Path(root) / "dvc.yaml"
    from zgdata.corpus import dep_paths

    stages = dvc_yaml(project, code_deps=code_deps, corpus_deps=dep_paths(project.corpus, root))
    write_text(path, HEADER + yaml.dump(stages, Dumper=_Dumper, sort_keys=False))
    return path


def regenerate(params_path: Path) -> tuple[Path, ProjectConfig]:
    """`zg pipeline`: rewrite the generated parts of params.yaml after an edit, then dvc.yaml from the result.

    Generated parts: ``blocks:`` (a conversion: one entry per block of partition.boundaries, each keeping its own
    train overrides; local pretraining: none), ``local.blocks`` (local.mode: sequential: one entry per block, the
    params key of its stage) and ``search:`` (its defaults, where a variant library needs one). Everything else is
    written back as read. Nothing is written unless the result parses as a project.
    """
    params_path = Path(params_path)
    params = load_params(params_path)  # the document itself: its sections are rewritten, not only read
    kind = project_kind(params)
    blocks = section(params, PartitionConfig).blocks()
    if kind is ProjectKind.LOCAL and section(params, LocalConfig).mode == "sequential":
        over = params["local"].get("blocks") or {}  # one params key per block stage
        params["local"]["blocks"] = {b.key: over.get(b.key) or {} for b in blocks}
    old = params.get("blocks") or {}
    params["blocks"] = (
        {}
        if kind is ProjectKind.LOCAL
        else {  # a local project's blocks are its partition's
            b.key: {
                **{k: v for k, v in old.get(b.key, {}).items() if k not in ("in", "out")},
                "in": b.input,
                "out": b.output,
            }
            for b in blocks
        }
    )
    project = ProjectConfig.from_params(params)
    if project.variants and "search" not in params:  # the search stage depends on search:, so it must exist
        params["search"] = defaults(SearchConfig)
    write_text(params_path, dump_params(params))
    code_deps = (params_path.parent / "zgtrain" / "block" / "train.py").exists()  # a checkout of ZeroGraph itself
    write_dvcignore(params_path.parent)  # a project from before the cards' lines gets them
    return write_pipeline(params_path.parent, project, code_deps=code_deps), project


def dump_params(params: dict) -> str:
    return yaml.dump(params, Dumper=_Dumper, sort_keys=False)


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError as e:  # the program itself is not on PATH
        raise ZgError(
            f"`{cmd[0]}` is not on PATH (zg init runs `{' '.join(cmd)}`)",
            fix="install git and dvc (make setup), or activate the environment that has them (.venv/bin)",
        ) from e
    if res.returncode:
        raise ZgError(
            f"`{' '.join(cmd)}` failed in {cwd}: {(res.stderr or res.stdout).strip()[:300]}",
            fix="install git and dvc (make setup) and retry",
        )


def init_project(root: Path, profile: str) -> Path:
    """Scaffold a conversion project: git + dvc init, params.yaml, dvc.yaml, .gitignore."""
    root = Path(root)
    params = profile_params(profile)
    if (root / "dvc.yaml").exists() or (root / "params.yaml").exists():
        raise ZgError(
            f"{root} already holds a ZeroGraph project (dvc.yaml or params.yaml exists)",
            fix="choose an empty directory, or run `zg pipeline` inside it to regenerate dvc.yaml",
        )
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".git").exists():
        _run(["git", "init", "-q"], root)
    if not (root / ".dvc").exists():
        _run(["dvc", "init", "-q"], root)
    # never hardlink/symlink: an in-place edit of a linked workspace file would change the cache object
    # itself, and `dvc status` would call it clean (docs/SHARING.md, bench/out/dvc_cache_type.txt)
    _run(["dvc", "config", "cache.type", "reflink,copy"], root)
    write_text(root / "params.yaml", dump_params(params))
    write_pipeline(root, ProjectConfig.from_params(params), code_deps=False)
    (root / ".gitignore").write_text("/data/.staging/\n/.zg/\n__pycache__/\n")  # .zg/: zgdata/lock.py's lock files
    write_dvcignore(root)
    return root


def write_dvcignore(root: Path) -> Path:
    """Add what DVC must not hash to ``root/.dvcignore`` (lines already there are kept, none is added twice):
    ``/.zg/`` (lock files, caches) and the student folders' model cards that evaluate rewrites
    (zgtrain/student/card.py ``DVC_IGNORED``; docs/ARCHITECTURE.md, "Model cards and DVC")."""
    from zgtrain.student.card import DVC_IGNORED

    path = Path(root) / ".dvcignore"
    text = path.read_text() if path.exists() else ""
    have = {line.strip() for line in text.splitlines()}
    new = [line for line in ("/.zg/", *DVC_IGNORED) if line not in have]
    if new:
        with open(path, "a") as f:
            f.write(("\n" if text and not text.endswith("\n") else "") + "\n" + "\n".join(new) + "\n")
    return path

"""The stage graph of a project, generated from params (the partition): DVC templates cannot compute k+1 or
expand a list into outs, so `zg pipeline` regenerates dvc.yaml after the partition changes. Each stage lists only
the data, code and params keys it uses: a stage that trains lists its section's keys one by one, all but those
that change none of its outputs (``UNRECORDED``: a checkpoint's period), so editing one of those reruns nothing.
DVC then needs every listed key in params.yaml: `zg pipeline` writes those sections' defaults where keys lack."""

from __future__ import annotations

from pathlib import Path

import yaml

from zgdata.config import ProjectKind
from zgdata.core.atomic import write_text
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.pipeline.code import CODE
from zgtrain.pipeline.search_stages import search_stages
from zgtrain.project.config import ProjectConfig, TrainConfig
from zgtrain.project.eval_sets import literal_paths, reads_corpus
from zgtrain.project.local import LocalConfig
from zgtrain.project.sections import RepairConfig

__all__ = ["HEADER", "Dumper", "dvc_yaml", "write_pipeline", "dump_params"]


def dvc_yaml(project: ProjectConfig, *, code_deps: bool, corpus_deps: list[str] = ()) -> dict:
    """PROJECT's stage graph. A conversion: teacher ... evaluate, plus the stages its params turn on (lm_eval,
    repair, the variant search, a virtual h00). Local pretraining: teacher (the tokenizer only), tokens, then
    local (or, with local.mode: sequential, local_bNN per block and local_export). ``code_deps``: list the code
    each stage runs (a checkout of ZeroGraph itself). ``corpus_deps``: the corpus files the tokens stage reads
    (zgdata/tokens/corpus.py dep_paths)."""

    def code(stage):
        return CODE[stage] if code_deps else []

    L, blocks = Layout(Path("")), project.partition.blocks()
    stages = _conversion_stages(project, L, code)
    stages["tokens"]["deps"][2:2] = list(corpus_deps)
    stages = _add_sample(stages, project, L, code, corpus_deps)
    if project.kind is ProjectKind.LOCAL:  # the teacher gives its tokenizer only
        stages["teacher"].update(params=["teacher"], outs=[str(L.teacher_hf), str(L.teacher_json)])
        stages = {"teacher": stages["teacher"], "tokens": stages["tokens"]} | _local_stages(project, L, blocks, code)
    else:
        _add_repair(stages, project, L, code)
        if project.variants:
            stages.update(search_stages(project, blocks, code))
        _virtual_first(stages, project, L, code)
        _online_targets(stages, project, L)
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


def _add_sample(stages: dict, project: ProjectConfig, L: Layout, code, corpus_deps) -> dict:
    """``teacher:sample`` in corpus.source: the sample stage (zgdata/tokens/sample.py) before tokens, which reads
    its corpus and lineage. Prompts from the real corpus make the corpus's files and keys its deps too."""
    corpus = project.corpus
    if not corpus.uses_sample():
        return stages
    if project.kind is ProjectKind.LOCAL:
        raise ZgError(
            "corpus.source teacher:sample needs the teacher's weights, which local pretraining does not prepare",
            key="corpus.source",
            fix="sample it in a conversion project and use its data/sample.jsonl as a corpus path",
        )
    from_corpus = corpus.sample_config().prompts == "corpus"
    own = [str(L.sample_jsonl)]
    sample = {
        "cmd": "zg data sample",
        "deps": [str(L.teacher_json), str(L.teacher_hf)]
        + ([d for d in corpus_deps if d not in own] if from_corpus else [])
        + code("sample"),
        "params": ["corpus"] if from_corpus else ["corpus.sample"],
        "outs": [str(L.sample_jsonl), str(L.sample_json)],
    }
    deps = stages["tokens"]["deps"]
    at = deps.index(own[0]) + 1 if own[0] in deps else len(deps)  # dep_paths lists data/sample.jsonl
    deps[at:at] = [p for p in [*own, str(L.sample_json)] if p not in deps]
    first = next(iter(stages))
    return {first: stages[first], "sample": sample} | {k: v for k, v in stages.items() if k != first}


def _data_stages(L: Layout, blocks, bnd: list[str], code) -> dict:
    """teacher, tokens, materialize and verify: the teacher pass and its inputs."""
    return {
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
    }


def _student_stages(L: Layout, blocks, code) -> dict:
    """train@KEY (one per block, from its boundary pair and teacher slice) and assemble."""
    return {
        "train": {
            "foreach": "${blocks}",
            "do": {
                "cmd": "zg train block ${key}",
                "deps": [str(L.boundary("${item.in}")), str(L.boundary("${item.out}")), str(L.teacher_slice("${key}"))]
                + code("train"),
                "params": ["seed", *TrainConfig.stage_keys(), "blocks.${key}"],
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
    }


def _evaluate_stage(project: ProjectConfig, L: Layout, blocks, bnd: list[str], code) -> dict:
    """evaluate: the teacher, the untrained conversion and the student on every eval set."""
    return {
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


def _conversion_stages(project: ProjectConfig, L: Layout, code) -> dict:
    """A conversion's main line: teacher, tokens, materialize, verify, train@KEY, assemble, evaluate (and lm_eval
    when lm_eval.tasks names some)."""
    blocks = project.partition.blocks()
    bnd = [str(L.boundary(n)) for n in project.partition.names]
    stages = {
        **_data_stages(L, blocks, bnd, code),
        **_student_stages(L, blocks, code),
        **_evaluate_stage(project, L, blocks, bnd, code),
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
    data = [str(L.tokens), str(L.tokens_json), str(L.teacher_hf), str(L.teacher_json)]
    if project.local.mode != "sequential":
        return {
            "local": {
                "cmd": "zg train local",
                "deps": data + code("local"),
                "params": ["seed", "partition", *LocalConfig.stage_keys()],
                "outs": [str(L.local_dir)],
                "metrics": [{str(L.local_metrics): {"cache": False}}],
                "plots": [{str(L.local_loss_curve): {"cache": False, "x": "step"}}],
            }
        }
    # a block's stage trains (local_export scores, with the held-out keys) and records no schedule
    shared = LocalConfig.stage_keys(without=(*LocalConfig.NOT_IDENTITY, "blocks"))
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


def _virtual_first(stages: dict, project: ProjectConfig, L: Layout, code) -> None:
    """materialize.virtual_first (zgdata/materialize/virtual.py): h00 is no output; what reads it depends on the tokens and the
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


def _online_targets(stages: dict, project: ProjectConfig, L: Layout) -> None:
    """``targets: online`` (``train:``, a block's or a variant's): the stage recomputes its pair with the teacher
    from the token set (zgtrain/block/targets.py), so the teacher and the tokens are its deps. DVC gives every item
    of a foreach the same deps, so every item gets them (and keeps its boundaries: `zg pipeline` after the edit)."""
    runs = {
        "train": [b.train for b in project.blocks.values()] or [project.train],
        "variant": list(project.variants.values()),
    }
    for name, cfgs in runs.items():
        if name in stages and any(c.targets == "online" for c in cfgs):
            do = stages[name]["do"]
            extra = [str(L.teacher_hf), str(L.teacher_json), str(L.tokens), str(L.tokens_json)]
            do["deps"] = list(dict.fromkeys(do["deps"] + extra))


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
        "params": ["seed", *RepairConfig.stage_keys()],
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


class Dumper(yaml.SafeDumper):
    pass


Dumper.add_representer(
    list,
    lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", v, flow_style=all(isinstance(x, (int, float)) for x in v) and bool(v)
    ),
)

HEADER = "# Generated by `zg pipeline` from params.yaml (partition). Edit params, then rerun `zg pipeline`.\n"


def write_pipeline(root: Path, project: ProjectConfig, *, code_deps: bool) -> Path:
    path = Path(root) / "dvc.yaml"
    from zgdata.tokens.corpus import dep_paths

    stages = dvc_yaml(project, code_deps=code_deps, corpus_deps=dep_paths(project.corpus, root))
    write_text(path, HEADER + yaml.dump(stages, Dumper=Dumper, sort_keys=False))
    return path


def dump_params(params: dict) -> str:
    return yaml.dump(params, Dumper=Dumper, sort_keys=False)

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
from zgdata.config import PartitionConfig, defaults, section
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = ["PROFILES", "profile_params", "dvc_yaml", "write_pipeline", "dump_params", "init_project"]

# A profile is a set of overrides on the config dataclasses' defaults (the one place defaults live).
PROFILES = {
    "smollm2": {
        "corpus": {"max_train_seqs": 128, "max_heldout_seqs": 16},
        "verify": {"sample": 2},
        # both cores of the 2-core demo machine, as torch used before train.threads existed: the
        # demo's blocks keep their speed (25-minute budget) and the bits recorded in docs/RESULTS.md
        "train": {"threads": 2},
    },
    "tiny": {
        "teacher": {"source": "random:tiny"},
        "corpus": {"documents": ["macbeth", "hamlet", "othello"], "heldout": ["macbeth"], "seq_len": 64,
                   "max_train_seqs": 48, "max_heldout_seqs": 8},
        "partition": {"boundaries": [0, 2, 4]},
        "materialize": {"batch_size": 8, "commit_rows": 16},
        "train": {"steps": 12, "warmup": 2, "checkpoint_every": 4},
        "eval": {"window": 8, "context_targets": 64, "context_min_pos": 32, "batch_size": 16},
        # repair stays off (steps 0); these fit a 12-step repair of the tiny student when a test turns it on
        "repair": {"lr": 3e-4, "warmup": 2, "checkpoint_every": 4},
    },
}


def profile_params(profile: str) -> dict:
    """params.yaml of a profile: every section's defaults with the profile's overrides, then its blocks."""
    from zgtrain.config import SECTIONS, ProjectConfig

    if profile not in PROFILES:
        raise ZgError(f"unknown profile '{profile}'", fix=f"use one of {', '.join(PROFILES)}")
    over = PROFILES[profile]
    params: dict = {"seed": 0}
    for name, cls in SECTIONS.items():
        params[name] = {**defaults(cls), **copy.deepcopy(over.get(name, {}))}
    part = section(params, PartitionConfig)
    params["blocks"] = {b.key: {"in": b.input, "out": b.output} for b in part.blocks()}
    ProjectConfig.from_params(params)  # a profile is valid by construction; this proves it
    return params


# Code each stage runs, listed as deps only in a checkout of ZeroGraph itself (code_deps=True).
_CODE = {
    "teacher": ["zgdata/teacher.py", "zgdata/teacher_identity.py", "zgdata/tokenizer_util.py", "zgdata/families.py"],
    "tokens": ["zgdata/tokens.py", "zgdata/corpus.py", "zgdata/packing.py"],
    "materialize": ["zgdata/capture_version.py"],
    "verify": ["zgdata/verify.py", "zgdata/capture.py", "zgdata/integrity.py", "zgdata/families.py"],
    "train": ["zgtrain/trainer.py", "zgtrain/block_model.py", "zgtrain/conversions.py", "zgtrain/objectives.py",
              "zgtrain/targets.py", "zgtrain/checkpoint.py", "zgdata/reader.py", "zgdata/families.py"],
    "assemble": ["zgtrain/assemble.py", "zgtrain/student.py", "zgtrain/templates", "zgdata/families.py"],
    "evaluate": ["zgtrain/evaluate.py", "zgtrain/metrics.py", "zgtrain/student.py", "zgdata/families.py"],
    "repair_eval": ["zgtrain/repair_eval.py", "zgtrain/repair_paths.py"],
    "repair": ["zgtrain/repair.py", "zgtrain/repair_paths.py", "zgtrain/repair_model.py", "zgtrain/checkpoint.py",
               "zgtrain/trainer.py", "zgtrain/student.py", "zgdata/reader.py", "zgdata/families.py"],
}


def dvc_yaml(params: dict, *, code_deps: bool) -> dict:
    part = section(params, PartitionConfig)
    L = Layout(Path(""))
    blocks = part.blocks()
    bnd = [str(L.boundary(n)) for n in part.names]

    def code(stage):
        return _CODE[stage] if code_deps else []

    stages = {
        "teacher": {"cmd": "zg teacher prepare", "deps": code("teacher"), "params": ["teacher", "partition"],
                    "outs": [str(L.teacher_hf), str(L.teacher_json), str(L.teacher_head)]
                    + [str(L.teacher_slice(b.key)) for b in blocks]},
        "tokens": {"cmd": "zg data tokenize", "deps": [str(L.teacher_json), str(L.teacher_hf)] + code("tokens"),
                   "params": ["corpus"], "outs": [str(L.tokens), str(L.tokens_json)]},
        # Every file a stage reads is a dep (tests/test_stage_deps.py), so `dvc repro --pull` fetches it.
        # Rewriting a Lance dataset changes its file names, so a needless materialize rerun invalidates
        # every block. hf and tokens.lance change only when their stages rerun, and then teacher.json or
        # tokens.json has usually changed too: teacher prepare writes the same bytes from the same inputs
        # and library versions, but a forced tokenize rewrites tokens.lance and so reruns materialize.
        "materialize": {"cmd": "zg data materialize",
                        "deps": [str(L.teacher_json), str(L.tokens_json), str(L.teacher_hf), str(L.tokens)]
                        + code("materialize"),
                        "params": ["materialize.storage_dtype", "materialize.compute_dtype", "partition.boundaries"],
                        "outs": bnd},
        "verify": {"cmd": "zg data verify",
                   "deps": bnd + [str(L.teacher_hf), str(L.teacher_json), str(L.tokens), str(L.tokens_json)]
                   + code("verify"),
                   "params": ["verify"], "metrics": [{str(L.verify_report): {"cache": False}}]},
        "train": {"foreach": "${blocks}", "do": {
            "cmd": "zg train block ${key}",
            "deps": ["data/boundaries/${item.in}.lance", "data/boundaries/${item.out}.lance",
                     "models/teacher/blocks/${key}.safetensors"] + code("train"),
            "params": ["seed", "train", "blocks.${key}"],
            "outs": ["models/blocks/${key}"],
            "metrics": [{"metrics/blocks/${key}.json": {"cache": False}}],
            "plots": [{"plots/loss/${key}.csv": {"cache": False, "x": "step", "y": "loss"}}]}},
        "assemble": {"cmd": "zg train assemble",
                     "deps": [str(L.block_dir(b.key)) for b in blocks] + [str(L.teacher_head), str(L.teacher_hf)]
                     + [str(L.teacher_json), str(L.tokens_json)] + code("assemble"),
                     "params": ["partition"], "outs": [str(L.student)]},
        "evaluate": {"cmd": "zg train evaluate",
                     "deps": [str(L.student), str(L.teacher_hf), str(L.tokens)] + bnd
                     + [str(L.block_dir(b.key)) for b in blocks]
                     + [str(L.teacher_head), str(L.teacher_json), str(L.tokens_json)]
                     + [str(L.block_loss_curve(b.key)) for b in blocks] + code("evaluate"),
                     "params": ["eval", "gates"],
                     "metrics": [{str(L.eval_metrics): {"cache": False}}],
                     "plots": [{"plots/eval/ce.csv": {"cache": False, "x": "model", "y": "ce"}},
                               {"plots/eval/shift.csv": {"cache": False, "x": "block", "y": "student_input"}},
                               "plots/eval/png"]},
    }
    _add_repair(stages, params, part, L, code)
    for s in stages.values():
        body = s.get("do", s)
        if not body.get("deps"):
            body.pop("deps", None)
    return {"stages": stages}


def _add_repair(stages: dict, params: dict, part: PartitionConfig, L: Layout, code) -> None:
    """The optional `repair` stage (issue 15), only when repair.steps > 0: the default pipeline is unchanged.

    It reads the student, the head slice and the last boundary (the teacher's logits, no teacher forward)
    and the train tokens; evaluate then also scores models/repaired and gates the repaired model.
    """
    from zgtrain.config import RepairConfig
    from zgtrain.repair_paths import repair_paths

    if not section(params, RepairConfig).enabled:
        return
    rp = repair_paths(L)
    stages["repair"] = {"cmd": "zg train repair",
                        "deps": [str(L.student), str(L.teacher_head), str(L.boundary(part.names[-1])), str(L.tokens),
                                 str(L.tokens_json)] + code("repair"),
                        "params": ["seed", "repair"], "outs": [str(rp.run_dir), str(rp.model)],
                        "metrics": [{str(rp.metrics): {"cache": False}}],
                        "plots": [{str(rp.loss_curve): {"cache": False, "x": "step", "y": "loss"}}]}
    ev = stages.pop("evaluate")
    ev["deps"] = ev["deps"][:1] + [str(rp.model)] + ev["deps"][1:] + code("repair_eval")
    ev["params"] = ev["params"] + ["repair.steps"]
    stages["evaluate"] = ev  # after repair in dvc.yaml's order


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(list, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=all(isinstance(x, (int, float)) for x in v) and bool(v)))

HEADER = "# Generated by `zg pipeline` from params.yaml (partition). Edit params, then rerun `zg pipeline`.\n"


def write_pipeline(root: Path, params: dict, *, code_deps: bool) -> Path:
    path = Path(root) / "dvc.yaml"
    write_text(path, HEADER + yaml.dump(dvc_yaml(params, code_deps=code_deps), Dumper=_Dumper, sort_keys=False))
    return path


def dump_params(params: dict) -> str:
    return yaml.dump(params, Dumper=_Dumper, sort_keys=False)


def _run(cmd: list[str], cwd: Path) -> None:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode:
        raise ZgError(f"`{' '.join(cmd)}` failed in {cwd}: {(res.stderr or res.stdout).strip()[:300]}",
                      fix="install git and dvc (make setup) and retry")


def init_project(root: Path, profile: str) -> Path:
    """Scaffold a conversion project: git + dvc init, params.yaml, dvc.yaml, .gitignore."""
    root = Path(root)
    params = profile_params(profile)
    if (root / "dvc.yaml").exists() or (root / "params.yaml").exists():
        raise ZgError(f"{root} already holds a ZeroGraph project (dvc.yaml or params.yaml exists)",
                      fix="choose an empty directory, or run `zg pipeline` inside it to regenerate dvc.yaml")
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".git").exists():
        _run(["git", "init", "-q"], root)
    if not (root / ".dvc").exists():
        _run(["dvc", "init", "-q"], root)
    _run(["dvc", "config", "cache.type", "reflink,hardlink,copy"], root)
    write_text(root / "params.yaml", dump_params(params))
    write_pipeline(root, params, code_deps=False)
    (root / ".gitignore").write_text("/data/.staging/\n/.zg/\n__pycache__/\n")  # .zg/: zgdata/lock.py's lock files
    with open(root / ".dvcignore", "a") as f:
        f.write("\n/.zg/\n")
    return root

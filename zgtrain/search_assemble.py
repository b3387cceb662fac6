"""Assemble the searched mix (search/choice.json) into a student: models/search/student/.

Each block is the variant the search chose (models/variants/BLOCK/NAME) or, where it chose ``teacher``, the
teacher's own block from its slice. The model is built and saved exactly as `zg train assemble` does
(zgtrain/assemble.py), so mixed MLP widths ship zg's modeling code and `from_pretrained` loads the result.
"""

from __future__ import annotations

import json

from zgdata.errors import ZgError
from zgdata.families import config_from_dict
from zgdata.layout import Layout
from zgdata.lineage import check, expected_fingerprints
from zgdata.lock import project_lock
from zgdata.teacher import load_slice
from zgtrain.assemble import build_from_blocks, save_student
from zgtrain.checkpoint import load_block
from zgtrain.config import IDENTITY_VARIANT, ProjectConfig
from zgtrain.conversions import identity
from zgtrain.variants import VariantLayout, search_choice, search_student, stage_name

__all__ = ["read_choice", "assemble_choice"]


def read_choice(project: ProjectConfig, layout: Layout) -> dict[str, str]:
    """{block: variant or 'teacher'} from search/choice.json, checked against params (blocks and variants)."""
    path = search_choice(layout)
    try:
        blocks = json.loads(path.read_text())["blocks"]
        mix = {b: str(o["variant"]) for b, o in blocks.items()}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ZgError(f"{path} is missing or not a search choice ({str(e)[:80]})", fix="run `dvc repro search`") from e
    if list(mix) != list(project.blocks) or not set(mix.values()) <= {IDENTITY_VARIANT, *project.variants}:
        raise ZgError(f"{path} chooses {mix}, which does not fit params.yaml's blocks and variants",
                      fix="rerun the search: `dvc repro search`")
    return mix


def assemble_choice(project: ProjectConfig, *, layout: Layout = Layout()) -> dict:
    mix = read_choice(project, layout)
    want = expected_fingerprints(layout, project.partition, project.materialize)
    blocks = []
    for spec in project.partition.blocks():
        name = mix[spec.key]
        if name == IDENTITY_VARIANT:
            tensors, smeta = load_slice(layout.teacher_slice(spec.key))
            block = identity(tensors, config_from_dict(smeta["config"]), None, None, None).eval()
            meta = {"state_sha256": None, "fingerprints": {}, "teacher_layers": smeta["layers"]}
        else:
            block, meta = load_block(VariantLayout(root=layout.root, block=spec.key, variant=name), spec.key)
            check(f"variant {spec.key}/{name}", meta["fingerprints"], "the current boundaries", want,
                  keys=(spec.input, spec.output), fix=f"it is stale: run `dvc repro {stage_name(spec.key, name)}`")
        blocks.append((spec, block, meta))
    model, summary = build_from_blocks(blocks, layout=layout)
    summary["choice"] = mix
    path = search_student(layout)
    with project_lock(layout, "search-assemble", writes=path):
        return {**save_student(model, summary, path, layout=layout), "choice": mix}

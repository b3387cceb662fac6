"""The generated dvc.yaml as a graph, for the optional and derived stages that no traced run covers.

tests/test_stage_deps.py checks, under strace, that the main pipeline's stages, repair and online blocks read only
what they declare. The stages below are generated from options those runs do not set (a search with
``materialize.virtual_first`` or online variants, its repair, a sequential local run, an export of another student):
here their graph is checked without running anything, in milliseconds. Every foreach item is resolved the way DVC
resolves it (``${key}``, ``${item.X}``), and:

- every dep under data/ or models/ is an output of some stage (a dep nothing writes leaves `dvc repro` failing
  with "missing dependency" on a fresh project, or silently fed from a stale folder);
- each option's stage depends on what it reads, so an edit upstream reruns it and DVC orders it after its producer.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.projects import project_of, set_keys
from zgtrain.pipeline.profiles import PROFILES, profile_params
from zgtrain.pipeline.stages import dvc_yaml

PRODUCED = ("data/", "models/")  # project data: every dep there is some stage's output (the corpus is not there)


def _sub(text: str, key: str, item: dict) -> str:
    return re.sub(r"\$\{item\.(\w+)\}", lambda m: str(item[m.group(1)]), text.replace("${key}", key))


def _entry(x, key: str, item: dict):
    """A deps/outs/metrics/plots entry with the item's values: a path, or {path: options}."""
    return _sub(x, key, item) if isinstance(x, str) else {_sub(k, key, item): v for k, v in x.items()}


def resolved(params: dict) -> dict[str, dict]:
    """``params``' dvc.yaml stages, every foreach item as its own stage ``name@key``."""
    stages = dvc_yaml(project_of(params), code_deps=False)["stages"]
    out = {}
    for name, stage in stages.items():
        if "foreach" not in stage:
            out[name] = stage
            continue
        items = params["blocks"] if stage["foreach"] == "${blocks}" else stage["foreach"]
        for key, item in items.items():
            out[f"{name}@{key}"] = {
                k: [_entry(x, key, item) for x in v] if isinstance(v, list) else v for k, v in stage["do"].items()
            }
    return out


def _paths(stage: dict, *keys: str) -> list[str]:
    return [x if isinstance(x, str) else next(iter(x)) for k in keys for x in stage.get(k, [])]


def dangling(stages: dict[str, dict]) -> list[str]:
    """'stage: dep' for every data or model dep that no stage writes (as an out, a metric or a plot, or inside
    an output folder)."""
    outs = [p.rstrip("/") for s in stages.values() for p in _paths(s, "outs", "metrics", "plots")]
    return [
        f"{name}: {dep}"
        for name, s in stages.items()
        for dep in s.get("deps", [])
        if dep.startswith(PRODUCED) and not any(dep == o or dep.startswith(o + "/") for o in outs)
    ]


def _with(profile: str, keys: dict) -> dict:
    """The profile's params with dotted keys set (``{"repair.steps": 3}``)."""
    return set_keys(profile_params(profile), keys)


OPTIONS = {
    **{name: (name, {}) for name in PROFILES},
    "tiny-search, virtual_first": ("tiny-search", {"materialize.virtual_first": True}),
    "tiny-search, repair": ("tiny-search", {"repair.steps": 3}),
    "tiny-search, online variant": ("tiny-search", {"variants.p50.targets": "online"}),
    "tiny, export repaired": (
        "tiny",
        {"repair.steps": 3, "export.enabled": True, "export.student": "repaired"},
    ),
    "tiny-search, export search": ("tiny-search", {"export.enabled": True, "export.student": "search"}),
    "local-tiny, sequential": ("local-tiny", {"local.mode": "sequential"}),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_data_dep_is_some_stages_output(option):
    profile, keys = OPTIONS[option]
    stages = resolved(_with(profile, keys))
    assert not dangling(stages), dangling(stages)


def test_the_dangling_check_sees_a_dep_nothing_writes():
    stages = resolved(profile_params("tiny"))
    stages["train@b01"]["deps"].append("data/boundaries/h03.lance")  # no stage writes boundary 3
    assert dangling(stages) == ["train@b01: data/boundaries/h03.lance"]


def test_search_variants_under_virtual_first_read_the_tokens_or_their_input_boundary():
    """With boundary 0 virtual (the `search` profile's default), a b00 variant recomputes it from the tokens and
    the head slice; every later variant reads its block's stored input boundary, not the tokens."""
    params = profile_params("search")
    assert params["materialize"]["virtual_first"] is True
    stages = resolved(params)
    for name, s in stages.items():
        if not name.startswith("variant@"):
            continue
        block = name.split("@")[1].split("-")[0]
        inp = params["blocks"][block]["in"]
        if block == "b00":
            assert "data/tokens.lance" in s["deps"] and f"data/boundaries/{inp}.lance" not in s["deps"], name
        else:
            assert f"data/boundaries/{inp}.lance" in s["deps"], name


def test_an_online_variant_declares_the_teacher_and_the_tokens():
    """``targets: online`` on one variant: its stage recomputes its pair with the teacher from the token set."""
    stages = resolved(_with("tiny-search", {"variants.p50.targets": "online"}))
    for key in ("b00-p50", "b01-p50"):
        deps = stages[f"variant@{key}"]["deps"]
        assert {"models/teacher/hf", "models/teacher/teacher.json", "data/tokens.lance"} <= set(deps), key
    cached = resolved(profile_params("tiny-search"))["variant@b01-p50"]["deps"]
    assert "models/teacher/hf" not in cached


def test_search_repair_depends_on_the_last_boundary_and_the_kept_mix():
    """search_repair trains the kept mix against the teacher's last boundary (its distillation target)."""
    params = _with("tiny-search", {"repair.steps": 3})
    last = params["blocks"][list(params["blocks"])[-1]]["out"]
    deps = resolved(params)["search_repair"]["deps"]
    assert f"data/boundaries/{last}.lance" in deps and "models/search/student" in deps


def test_sequential_local_blocks_are_ordered_by_their_boundaries():
    """local.mode sequential: block k+1 trains on what block k wrote, so it depends on it (an edit of block k
    reruns block k+1, and DVC runs them in order); block 0 reads only the tokens."""
    stages = resolved(_with("local-tiny", {"local.mode": "sequential"}))
    blocks = sorted(n for n in stages if n.startswith("local_b"))
    assert len(blocks) >= 2
    for up, down in zip(blocks, blocks[1:], strict=False):
        handed = set(_paths(stages[up], "outs")) & set(stages[down]["deps"])
        assert handed and all(p.startswith("data/local/h") for p in handed), (up, down, handed)
    assert not any(d.startswith("data/local/") for d in stages[blocks[0]]["deps"])


@pytest.mark.parametrize(
    "student, folder, keys",
    [
        ("student", "models/student", {}),
        ("repaired", "models/repaired", {"repair.steps": 3}),
        ("search", "models/search/student", {}),
    ],
)
def test_export_depends_on_the_student_it_exports(student, folder, keys):
    profile = "tiny-search" if student == "search" else "tiny"
    stages = resolved(_with(profile, {"export.enabled": True, "export.student": student, **keys}))
    deps = stages["export"]["deps"]
    assert folder in deps and f"zg export {student} " in stages["export"]["cmd"]
    others = {"models/student", "models/repaired", "models/search/student"} - {folder}
    assert not others & set(deps), deps

"""A stage's reads against its declared deps (tests/test_stage_deps.py's check, also run by
tests/zgdata/test_virtual.py and tests/zgtrain/search/test_search.py).

A path the command opened counts as a read of the project when it is inside the project, existed before the
command opened it (``stage_trace.reads``) and is not under `.git/`, `.dvc/`, `.zg/`, `data/.staging/` or a
`__pycache__` folder. It must then be under a declared dep, under the stage's own outputs, be params.yaml for
a stage with `params:`, or be dvc.yaml (the staleness check, zgtrain/pipeline/current.py). Opening a folder that holds a declared dep (listing it) is allowed; any file opened inside
it is checked on its own.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.stage_trace import reads, stage_opens, traced_run

__all__ = [
    "IGNORED_TOP",
    "IGNORED_PREFIX",
    "entry_paths",
    "expand",
    "pipeline_stages",
    "is_under",
    "trace_stage",
    "undeclared",
    "assert_saw_reads",
]

IGNORED_TOP = (
    ".git",
    ".dvc",
    ".zg",
    "dvc.lock",
    ".dvcignore",
)  # dvc.lock and .dvcignore: read to check inputs against git's record, as DVC hashes them (zgdata/trust/dvc_lock.py)
IGNORED_PREFIX = ("data/.staging/",)  # the folder itself too: materialize lists it to remove dead runs


def entry_paths(entries) -> list[str]:
    """Paths of dvc.yaml outs/metrics/plots/deps entries (a string or a one-key mapping)."""
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def expand(value, key: str, item: dict):
    """A `foreach` stage's ``do`` body for one ``key`` and its ``item``: ``${key}`` and ``${item.*}`` filled in."""
    if isinstance(value, str):
        value = value.replace("${key}", key)
        for k, v in item.items():
            value = value.replace("${item." + k + "}", str(v))
        return value
    if isinstance(value, list):
        return [expand(v, key, item) for v in value]
    if isinstance(value, dict):
        return {expand(k, key, item): expand(v, key, item) for k, v in value.items()}
    return value


def pipeline_stages(root: Path) -> dict[str, dict]:
    """dvc.yaml's stages, the `foreach: ${blocks}` stage expanded to name@key with params.yaml's blocks."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())
    params = yaml.safe_load((root / "params.yaml").read_text())
    stages = {}
    for name, body in spec["stages"].items():
        if (
            "foreach" in body
        ):  # ${blocks}, or a generated mapping (materialize.virtual_first: zgtrain/pipeline/stages.py)
            assert body["foreach"] == "${blocks}" or isinstance(body["foreach"], dict), body["foreach"]
            items = params["blocks"] if body["foreach"] == "${blocks}" else body["foreach"]
            for key, item in items.items():
                stages[f"{name}@{key}"] = expand(body["do"], key, item)
        else:
            stages[name] = body
    return stages


def is_under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def trace_stage(root: Path, stage: dict, log_dir: Path) -> dict[str, bool]:
    """Run the stage's cmd in root as DVC does (``sh -c CMD``: dash forks the command, bash execs it) under
    strace; the project paths it read (``stage_trace.reads``: relative path -> is it a folder)."""
    res = traced_run(["sh", "-c", stage["cmd"]], root, log_dir, timeout=900)
    assert res.returncode == 0, f"`{stage['cmd']}` failed under strace ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return reads(stage_opens(log_dir, root, {"stage": stage["cmd"]})["stage"])


def undeclared(stage: dict, read: dict[str, bool]) -> list[str]:
    """The paths a stage read (``stage_trace.reads``: path -> is it a folder) that are not its declared deps."""
    deps, own = (
        entry_paths(stage.get("deps")),
        entry_paths(stage.get("outs")) + entry_paths(stage.get("metrics")) + entry_paths(stage.get("plots")),
    )
    bad = []
    for p in sorted(read):
        parts = p.split("/")
        if parts[0] in IGNORED_TOP or (p + "/").startswith(IGNORED_PREFIX) or "__pycache__" in parts:
            continue
        if is_under(p, own) or is_under(p, deps):
            continue  # its own output, or declared (what the command created itself is not in ``read``)
        if p == "params.yaml" and stage.get("params"):
            continue
        if p == "dvc.yaml":  # the graph itself: each stage DVC starts checks it against params.yaml, and refuses
            continue  # or runs; it changes no output (zgtrain/pipeline/current.py)
        if read[p] and any(d.startswith(p + "/") for d in deps):
            continue  # listing the folder that holds a declared dep
        bad.append(p)
    return bad


def assert_saw_reads(name: str, stage: dict, opened) -> None:
    """The trace saw the command's reads: every stage reads params.yaml and at least one declared dep."""
    assert "params.yaml" in opened, (name, sorted(opened))
    assert not stage.get("deps") or any(is_under(p, entry_paths(stage["deps"])) for p in opened), (
        name,
        sorted(opened),
    )

"""A project's scaffold: `zg init` (git, dvc, params.yaml from a profile, dvc.yaml, the ignore files) and
`zg pipeline` (the generated parts of params.yaml and dvc.yaml rewritten after an edit)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from zgdata.config import PartitionConfig, ProjectKind, defaults, load_params, project_kind, section
from zgdata.core.atomic import write_text
from zgdata.errors import ZgError
from zgtrain.pipeline.profiles import profile_params
from zgtrain.pipeline.stages import dump_params, write_pipeline
from zgtrain.project.config import BLOCKS_FIX, ProjectConfig, TrainConfig
from zgtrain.project.local import LocalConfig
from zgtrain.project.sections import RepairConfig, SearchConfig

__all__ = ["has_code", "init_project", "regenerate", "regenerated", "write_dvcignore"]


def regenerate(params_path: Path) -> tuple[Path, ProjectConfig]:
    """`zg pipeline`: rewrite the generated parts of params.yaml after an edit (``regenerated``), then dvc.yaml
    from the result. Nothing is written unless the result parses as a project."""
    params_path = Path(params_path)
    params, project = regenerated(load_params(params_path))
    write_text(params_path, dump_params(params))
    write_dvcignore(params_path.parent)  # adds the model cards' lines where the project lacks them
    return write_pipeline(params_path.parent, project, code_deps=has_code(params_path.parent)), project


def has_code(root: Path) -> bool:
    """Is ROOT a checkout of ZeroGraph itself? Its stages then list the code they run (``code_deps``)."""
    return (Path(root) / "zgtrain" / "block" / "train.py").exists()


def regenerated(params: dict) -> tuple[dict, ProjectConfig]:
    """PARAMS (a params.yaml document, changed in place) with its generated parts rewritten, and its project.

    Generated parts: ``blocks:`` (a conversion: one entry per block of partition.boundaries, each keeping its own
    train overrides; local pretraining: none), ``local.blocks`` (local.mode: sequential: one entry per block, the
    params key of its stage), and the defaults of every key a section lacks where dvc.yaml lists that section's
    keys one by one (``train:``, ``repair:``, ``local:``, and ``search:`` where a variant library needs it): DVC
    refuses a listed key that params.yaml lacks. Everything else keeps the values read; written back, it takes
    zg's layout: YAML comments are not kept.
    """
    kind = project_kind(params)
    blocks = section(params, PartitionConfig).blocks()
    if kind is ProjectKind.LOCAL and section(params, LocalConfig).mode == "sequential":
        over = params["local"].get("blocks") or {}  # one params key per block stage
        params["local"]["blocks"] = {b.key: over.get(b.key) or {} for b in blocks}
    old = params.get("blocks") or {}
    if not isinstance(old, Mapping):
        raise ZgError("params section 'blocks' must be a mapping of block keys", key="blocks", fix=BLOCKS_FIX)
    for key, body in old.items():
        if body is not None and not isinstance(body, Mapping):
            raise ZgError(f"blocks.{key} must be a mapping of train keys", key=f"blocks.{key}", fix=BLOCKS_FIX)
    params["blocks"] = (
        {}
        if kind is ProjectKind.LOCAL
        else {  # a local project's blocks are its partition's
            b.key: {
                **{k: v for k, v in (old.get(b.key) or {}).items() if k not in ("in", "out")},
                "in": b.input,
                "out": b.output,
            }
            for b in blocks
        }
    )
    project = ProjectConfig.from_params(params)
    listed = {  # the sections whose keys dvc.yaml lists one by one (zgtrain/pipeline/stages.py), where it does
        TrainConfig: kind is not ProjectKind.LOCAL,
        RepairConfig: project.repair.enabled,
        LocalConfig: kind is ProjectKind.LOCAL,
        SearchConfig: bool(project.variants),
    }
    for cls, used in listed.items():
        if used:
            params[cls.SECTION] = {**defaults(cls), **(params.get(cls.SECTION) or {})}
    return params, project


def _dvc_init(root: Path) -> None:
    """`dvc init -q` (where .dvc/ is missing) and `dvc config cache.type reflink,copy`, through DVC's Python API in
    this process: the same files (.dvc/config, .dvc/.gitignore, .dvcignore, staged in git) as the two `dvc`
    commands, which took 2.4 CPU-seconds as processes against 1.0 here (DVC's import included)."""
    import logging

    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    from zgtrain.exec.stage import dvc_logging

    # Repo.init logs "Initialized DVC repository." at INFO; `dvc init -q` did not
    with dvc_logging(logging.WARNING):
        try:
            repo = Repo(root) if (root / ".dvc").exists() else Repo.init(root)
            with repo:
                # never hardlink/symlink: an in-place edit of a linked workspace file would change the cache
                # object itself, and `dvc status` would call it clean (docs/SHARING.md, bench/out/dvc_cache_type.txt)
                with repo.config.edit() as conf:
                    conf["cache"]["type"] = "reflink,copy"
        except DvcException as e:
            raise ZgError(
                f"DVC could not set up {root}: {e}", fix="check the folder's .dvc/ and .git/, then retry"
            ) from e


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError as e:  # the program itself is not on PATH
        raise ZgError(
            f"`{cmd[0]}` is not on PATH (zg init runs `{' '.join(cmd)}`)",
            fix=f"install {cmd[0]}, or activate the environment that has it",
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
    _dvc_init(root)
    write_text(root / "params.yaml", dump_params(params))
    write_pipeline(root, ProjectConfig.from_params(params), code_deps=False)
    # .zg/: zgdata/core/lock.py's lock files; data/.sample.parts/: a running or killed sample stage's batches;
    # models/export/: `zg export`'s default output, a deployable copy of a student (the export stage's is DVC's)
    (root / ".gitignore").write_text("/data/.staging/\n/data/.sample.parts/\n/.zg/\n__pycache__/\n/models/export/\n")
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

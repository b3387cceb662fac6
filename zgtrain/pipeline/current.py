"""Is a project's pipeline what `zg pipeline` would write from its params.yaml now?

dvc.yaml and params.yaml's generated parts (``blocks:``, ``local.blocks``, the listed sections' defaults) follow
params.yaml only when `zg pipeline` runs after an edit. Without it DVC runs the old graph: a stage that params turn
on never runs, the deps an edit adds are neither fetched nor watched, a listed key the edit removed fails inside
DVC. Every stage command that DVC starts, and `zg repro`, check first (``check``) and refuse a stale graph by
name. Where `dvc repro` finds no stage changed, no zg command runs and nothing can refuse:
docs/tutorials/convert-your-model.md says which edits need `zg pipeline`.

Only zg's own stages are compared: a stage the user added to dvc.yaml, whose command is not `zg`, is left alone.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from zgdata.config import load_params
from zgdata.errors import ZgError
from zgdata.yamlio import safe_load
from zgtrain.pipeline.scaffold import has_code, regenerated
from zgtrain.pipeline.stages import HEADER, dump_params, dvc_yaml

__all__ = ["check", "differences"]


def _plain(doc) -> object:
    """DOC as the file zg writes gives it back: tuples become lists (params.yaml and dvc.yaml share a Dumper)."""
    return safe_load(dump_params(doc))


def _stage_names(stages: dict) -> list[str]:
    return [name for name, body in stages.items() if _is_zg(body)]


def _is_zg(body) -> bool:
    cmd = (body.get("do", body) if isinstance(body, dict) else {}).get("cmd", "")
    return isinstance(cmd, str) and cmd.startswith("zg ")


def differences(root: Path) -> list[str]:
    """What differs between ROOT's dvc.yaml and params.yaml and what `zg pipeline` would write from params.yaml:
    one phrase per section or stage ("params.yaml blocks", "stage repair missing", "stage evaluate changed", "stage
    repair not in params"). Empty where they agree, and where ROOT's dvc.yaml is not one `zg pipeline` wrote (no
    dvc.yaml, or not its header line: another project's stage that runs a `zg` command, such as `zg data verify` of
    imported boundaries, has its own params.yaml)."""
    from zgdata.tokens.corpus import dep_paths

    root = Path(root)
    try:
        text = (root / "dvc.yaml").read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise ZgError(f"{root / 'dvc.yaml'} cannot be read: {e}", fix="regenerate it with `zg pipeline`") from e
    if not text.startswith(HEADER):
        return []
    try:
        on_disk = (safe_load(text) or {}).get("stages") or {}
    except (yaml.YAMLError, AttributeError) as e:
        raise ZgError(f"{root / 'dvc.yaml'} is not a DVC pipeline: {e}", fix="regenerate it with `zg pipeline`") from e
    params = load_params(root / "params.yaml")
    new, project = regenerated(copy.deepcopy(params))
    have, want = _plain(params), _plain(new)
    out = [f"params.yaml {key}" for key in want if have.get(key) != want[key]]
    generated = _plain(dvc_yaml(project, code_deps=has_code(root), corpus_deps=dep_paths(project.corpus, root)))
    stages = generated["stages"]
    for name in stages:
        if name not in on_disk:
            out.append(f"stage {name} missing")
        elif on_disk[name] != stages[name]:
            out.append(f"stage {name} changed")
    out += [f"stage {name} not in params" for name in _stage_names(on_disk) if name not in stages]
    return out


def check(root: Path, *, experiment: str | None = None) -> None:
    """Refuse ROOT's pipeline where it is stale against params.yaml (``differences``), naming what differs.

    In a DVC experiment (EXPERIMENT: its name) warn instead: `dvc exp run -S KEY=VALUE` sets params.yaml and runs
    the graph it has, with no step between where `zg pipeline` could run, and arms such as the objective study's
    ``-S train.targets=online`` rely on that (their stages run with the deps of the graph they have)."""
    if not (found := differences(root)):
        return
    what = f"dvc.yaml is out of date with params.yaml ({', '.join(found)})"
    if experiment is not None:
        from zgdata.core.progress import stderr

        stderr.print(
            f"warning: {what}: experiment {experiment} runs the stage graph dvc.yaml holds (`dvc exp run -S` cannot"
            " regenerate it). For a graph that follows the edit, set the key in params.yaml, run `zg pipeline`,"
            " then `dvc exp run`.",
            markup=False,
            highlight=False,
        )
        return
    raise ZgError(
        f"{what}: params.yaml was edited without `zg pipeline`, so DVC would run the old stage graph",
        fix="run `zg pipeline` (it rewrites dvc.yaml and params.yaml's generated parts), commit both, then run again",
    )

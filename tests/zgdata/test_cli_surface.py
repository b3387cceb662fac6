"""A deliberate pin of the `zg` command surface: every command path and its parameters.

If this fails, the CLI changed. Update EXPECTED only when the change is intended (and documented).
Options are listed by their flags, positional arguments as ``ARG:name``.
"""

from __future__ import annotations

import typer

from zgtrain.cli import app

EXPECTED = {
    "zg": ["--debug"],
    "zg data": [],
    "zg data inspect": ["--json", "--version", "--versions", "--wide", "ARG:paths"],
    "zg data materialize": ["--json", "--params"],
    "zg data sample": ["--json", "--params"],
    "zg data tokenize": ["--json", "--params"],
    "zg data verify": ["--boundaries", "--full", "--json", "--lineage-only", "--params", "--sample"],
    "zg export": ["--dtype", "--format", "--json", "--out", "ARG:student"],
    "zg init": ["--profile", "ARG:directory"],
    "zg params": ["--json", "ARG:keys"],
    "zg pipeline": ["--params"],
    "zg repro": ["--address", "--data", "--jobs", "--json", "-j", "ARG:targets"],
    "zg search": [],
    "zg search assemble": ["--json", "--params"],
    "zg search repair": ["--json", "--params", "--restart", "--stop-after"],
    "zg search costs": ["--json", "--measure", "--params"],
    "zg search run": ["--json", "--params"],
    "zg search show": ["--json", "--params"],
    "zg teacher": [],
    "zg teacher prepare": ["--json", "--params"],
    "zg train": [],
    "zg train assemble": ["--json", "--params"],
    "zg train block": ["--json", "--params", "--restart", "--stop-after", "--targets", "ARG:key"],
    "zg train evaluate": ["--json", "--params", "--strict"],
    "zg train lm-eval": ["--json", "--limit", "--params", "ARG:tasks"],
    "zg train repair": ["--json", "--params", "--restart", "--stop-after"],
    "zg train local": ["--json", "--params", "--restart", "--stop-after"],
    "zg train local-block": ["--json", "--params", "--restart", "--stop-after", "ARG:key"],
    "zg train local-export": ["--json", "--params"],
    "zg train variant": ["--json", "--params", "--restart", "ARG:key", "ARG:variant"],
}


def _surface(cmd, path: str) -> dict[str, list[str]]:
    params = []
    for p in cmd.params:
        if p.param_type_name == "option":
            params.extend(p.opts + p.secondary_opts)
        else:
            params.append(f"ARG:{p.name}")
    out = {path: sorted(params)}
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        out.update(_surface(sub, f"{path} {name}"))
    return out


def test_cli_surface_is_pinned():
    assert _surface(typer.main.get_command(app), "zg") == EXPECTED

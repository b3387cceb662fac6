"""The generated reference pages (docs/reference/) are committed: regenerate them in memory and compare."""

from __future__ import annotations

from pathlib import Path

import typer

from zgtrain.cli import app
from zgtrain.docs_ref import COMMAND, pages
from zgtrain.project.config import params_rows

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_committed_reference_pages_are_current():
    for rel, text in pages().items():
        path = DOCS / rel
        assert path.exists(), f"{path} is missing: run `{COMMAND}`"
        assert path.read_text() == text, f"{path} is out of date: run `{COMMAND}`"


def test_params_page_lists_every_key_zg_params_shows():
    page = (DOCS / "reference" / "params.md").read_text()
    for key, _default, _doc in params_rows():
        assert f"| `{key}` |" in page, key


def _paths(cmd, path: str):
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _paths(sub, f"{path} {name}")


def test_cli_page_lists_every_command_and_option():
    page = (DOCS / "reference" / "cli.md").read_text()
    for path, cmd in _paths(typer.main.get_command(app), "zg"):
        section = page.split(f"\n## `{path}`\n", 1)
        assert len(section) == 2, path
        body = section[1].split("\n## ", 1)[0]
        for p in cmd.params:
            names = [p.name.upper()] if p.param_type_name == "argument" else p.opts
            assert all(f"`{n}`" in body for n in names), (path, names)

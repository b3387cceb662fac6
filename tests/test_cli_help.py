"""`zg` help without typer: the pages zgtrain/cli_help.py holds are what typer prints, and `zg` serves them.

zgtrain.cli.main prints `zg`, `zg --help`, `zg GROUP` and `zg COMMAND... --help` from zgtrain/cli_help.py (generated
by `python -m zgtrain.docs_ref` from the command tree) instead of importing typer. These tests fail when that file is
stale, when a page differs from typer's own answer, when the fast path answers anything but a help request, and when
the top-level page leaves out a command or cuts its description.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
from typer._click.exceptions import NoArgsIsHelpError

from zgtrain.cli import app, help_page
from zgtrain.cli_help import GROUPS, PAGES
from zgtrain.docs_ref import COMMAND, HELP_MODULE, help_module, help_pages


def _typer_answer(args: list[str], capsys, monkeypatch, columns: int = 80) -> tuple[str, int]:
    """What typer itself prints for `zg ARGS` (stdout) and its exit code, as zgtrain.cli.main runs it."""
    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    try:
        rc = typer.main.get_command(app).main(args=list(args), prog_name="zg", standalone_mode=False)
    except NoArgsIsHelpError as e:  # a group without a command: main prints its help, exit 2
        print(e.format_message())
        rc = 2
    return capsys.readouterr().out, rc


def test_help_module_is_current():
    assert HELP_MODULE.read_text() == help_module(), f"{HELP_MODULE} is out of date: run `{COMMAND}`"


def test_every_command_path_has_its_page():
    found, groups = help_pages()
    assert set(PAGES) == set(found) and set(GROUPS) == groups
    assert {"zg", "zg data", "zg train", "zg train block", "zg data inspect"} <= set(PAGES)


def test_each_page_is_what_typer_prints_for_help(capsys, monkeypatch):
    for path, page in PAGES.items():
        args = [*path.split()[1:], "--help"]
        assert _typer_answer(args, capsys, monkeypatch) == (page, 0), path
        assert help_page(args) == (page, 0), path


def test_a_group_without_a_command_prints_its_page_and_exits_2(capsys, monkeypatch):
    for path in GROUPS:
        args = path.split()[1:]
        assert _typer_answer(args, capsys, monkeypatch) == (PAGES[path], 2), path
        assert help_page(args) == (PAGES[path], 2), path


@pytest.mark.parametrize(
    "args",
    [
        ["params"],  # a command without --help runs
        ["train", "block"],  # missing argument: typer's usage error
        ["train", "block", "b00", "--help"],  # an argument before --help: typer answers
        ["--debug", "--help"],
        ["nosuch", "--help"],
        ["-h"],
        ["--help", "data"],
    ],
)
def test_anything_else_is_left_to_typer(args):
    assert help_page(args) is None


def test_a_narrow_terminal_is_left_to_typer(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    assert help_page(["--help"]) is None
    narrow, rc = _typer_answer(["--help"], capsys, monkeypatch, columns=60)
    assert rc == 0 and narrow != PAGES["zg"] and max(map(len, narrow.splitlines())) <= 58


def test_top_level_help_lists_every_command_with_its_whole_first_paragraph():
    page = " ".join(PAGES["zg"].split())
    root = typer.main.get_command(app)
    assert len(root.commands) >= 8
    for name, cmd in root.commands.items():
        first = " ".join(cmd.help.strip().split("\n\n")[0].split())
        assert f" {name} {first} " in f"{page} ", name
    assert "..." not in PAGES["zg"].split("Commands:")[1]


# Runs `zg ARGS` as the `zg` script does, then writes its exit code and the imported top-level modules to OUT.
PROBE = """
import json, sys
out, args = sys.argv[1], sys.argv[2:]
from zgtrain.cli import main
try:
    main(args)
    code = 0
except SystemExit as e:
    code = e.code
json.dump({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}, open(out, "w"))
"""


@pytest.mark.parametrize(("args", "page", "code"), [(["--help"], "zg", 0), ([], "zg", 2), (["train"], "zg train", 2)])
def test_zg_prints_help_without_importing_typer_or_rich(args, page, code, tmp_path):
    out = tmp_path / "probe.json"
    env = {**os.environ, "COLUMNS": "100"}
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args], capture_output=True, text=True, env=env, check=False
    )
    got = json.loads(out.read_text())
    assert (res.stdout, res.stderr, got["code"]) == (PAGES[page], "", code)
    loaded = sorted(m for m in ("typer", "click", "rich", "pydantic") if m in got["modules"])
    assert not loaded, f"zg {' '.join(args)} imported {', '.join(loaded)}"


def test_zg_without_a_command_on_a_narrow_terminal_prints_typers_page(capsys, monkeypatch):
    res = subprocess.run(
        [sys.executable, "-c", "from zgtrain.cli import main; main([])"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "60"},
        check=False,
    )
    page, _ = _typer_answer([], capsys, monkeypatch, columns=60)
    assert (res.stdout, res.stderr, res.returncode) == (page, "", 2)
    assert page != PAGES["zg"]

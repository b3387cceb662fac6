"""`zg data inspect` views fit a terminal: the default at 80 and 100 columns, --wide, --versions; --json unchanged.

Real Lance datasets of the tiny profile (teacher, tokens, materialize), rendered by rich at a fixed width.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.helpers.runners import zg_main
from zgdata.inspect import collect, render

VIEWS = {"default": {}, "wide": {"wide": True}, "versions": {"versions": True}, "all": {"wide": True, "versions": True}}
HEADERS = {
    "default": ("name", "layer", "rows", "codec", "size", "fingerprint", "complete", "history"),
    "wide": ("teacher", "tokenizer", "tokens", "source", "seq_len", "hidden", "dtype", "stats"),
    "versions": ("version", "timestamp", "message"),
}


def _infos(root):
    return collect([root / "data" / "tokens.lance", root / "data" / "boundaries"])


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("view", list(VIEWS))
def test_views_fit_and_cut_no_header_or_fingerprint(tiny_built, width, view):
    infos = _infos(tiny_built)
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    render(infos, console, **VIEWS[view])
    text = console.export_text()
    assert "…" not in text  # rich marks a cut cell with an ellipsis: no cell is cut, headers and hashes included
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    lines = text.splitlines()
    shown = {w for line in lines for w in line.split()}
    for head in (
        HEADERS["default"]
        + (HEADERS["wide"] if "wide" in VIEWS[view] else ())
        + (HEADERS["versions"] if "versions" in VIEWS[view] else ())
    ):
        assert head in shown, (view, width, head)
    for i in infos:  # each fingerprint's 12-character prefix, whole, on one line
        assert i["fingerprint"][:12] in shown
        if "wide" in VIEWS[view]:
            assert i["lineage"]["teacher_sha256"][:12] in shown
    if "versions" not in VIEWS[view]:
        assert "materialized rows" not in text  # the full history only with --versions
    else:
        assert text.count(" versions") >= len(infos)


def test_default_view_has_one_history_line_per_dataset(tiny_built):
    infos = _infos(tiny_built)
    console = Console(width=100, record=True, force_terminal=False, color_system=None)
    render(infos, console)
    text = console.export_text()
    for i in infos:
        n, last = len(i["versions"]), i["versions"][-1]["timestamp"].replace("T", " ")[:16]
        row = next(line for line in text.splitlines() if line.split() and line.split()[0] == i["name"])
        assert f"{n}, last {last}" in row and i["fingerprint"][:12] in row
    assert "teacher" not in text.split()  # the lineage columns only with --wide


def test_cli_views_and_json(tiny_project):
    plain = zg_main("data", "inspect", cwd=tiny_project).stdout
    wide = zg_main("data", "inspect", "--wide", "--versions", cwd=tiny_project).stdout
    infos = json.loads(zg_main("data", "inspect", "--json", cwd=tiny_project).stdout)
    again = json.loads(json.dumps(_infos(tiny_project), default=str))  # --json: exactly collect()'s records
    assert [{k: v for k, v in i.items() if k != "path"} for i in infos] == [
        {k: v for k, v in i.items() if k != "path"} for i in again
    ]  # (paths: relative there, absolute here)
    for i in infos:
        assert i["fingerprint"][:12] in plain and i["lineage"]["tokenizer_sha256"][:12] in wide
    assert "lineage" in wide and "materialized rows" in wide and "materialized rows" not in plain


def test_piped_tables_keep_a_dataset_on_one_line_and_columns_still_rules(tiny_project, monkeypatch):
    """Piped, a dataset's row is one line (grep finds all of it); COLUMNS, where set, is the width, as in a terminal."""
    monkeypatch.delenv("COLUMNS", raising=False)
    infos = _infos(tiny_project)
    piped = zg_main("data", "inspect", "--wide", cwd=tiny_project).stdout.splitlines()
    narrow = zg_main("data", "inspect", cwd=tiny_project, env={"COLUMNS": "80"}).stdout.splitlines()
    for i in infos:
        last = i["versions"][-1]["timestamp"].replace("T", " ")[:16]
        rows = [line for line in piped if line.split() and line.split()[0] == i["name"]]
        assert len(rows) == 3  # the datasets, lineage and storage tables: one line each
        assert i["fingerprint"][:12] in rows[0] and f"last {last}" in rows[0]
        assert i["lineage"]["teacher_sha256"][:12] in rows[1]
        row = next(line for line in narrow if line.split() and line.split()[0] == i["name"])
        assert f"last {last}" not in row  # wrapped at 80 columns: the history cell goes on below
    assert max(map(len, narrow)) <= 80 < max(map(len, piped))


def test_the_source_of_a_dataset_inside_an_imported_folder_names_its_own_path(tmp_path):
    """`dvc import A data/boundaries` brings the whole folder: inspect of one boundary in it names the boundary's
    path in the source repository, not the folder's (each boundary imported alone is test_sharing.py's case)."""
    from zgdata.inspect import provenance

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "data" / "boundaries" / "h02.lance").mkdir(parents=True)
    (tmp_path / "data" / "boundaries.dvc").write_text(
        "md5: 0123\nfrozen: true\ndeps:\n- path: data/boundaries\n  repo:\n    url: /teams/a\n    rev_lock: 89ab\n"
        "outs:\n- md5: cdef.dir\n  path: boundaries\n"
    )
    for rel, inner in (("data/boundaries/h02.lance", "data/boundaries/h02.lance"), ("data/boundaries", None)):
        info = provenance(tmp_path / rel)
        assert info["tracked_by"] == "data/boundaries.dvc" and info["path"] == rel, info
        assert info["import"] == {"url": "/teams/a", "path": inner or rel, "rev": None, "rev_lock": "89ab"}, info


def test_a_path_that_only_starts_like_a_tracked_output_is_not_tracked(tmp_path):
    """dvc.lock tracks an output and what lies inside it: ``data/tokens.lance.old`` beside the tracked
    ``data/tokens.lance`` shares its name's first characters but is neither, so nothing tracks it."""
    from zgdata.inspect import provenance

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "data" / "tokens.lance" / "data").mkdir(parents=True)
    (tmp_path / "data" / "tokens.lance.old").mkdir()
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  tokenize:\n    cmd: zg data tokenize\n    outs:\n"
        "    - path: data/tokens.lance\n      md5: 0123.dir\n      size: 10\n      nfiles: 1\n"
    )
    tracked = {"tracked_by": "dvc.lock", "stage": "tokenize"}
    assert provenance(tmp_path / "data" / "tokens.lance") == {**tracked, "path": "data/tokens.lance"}
    assert provenance(tmp_path / "data" / "tokens.lance" / "data") == {**tracked, "path": "data/tokens.lance/data"}
    assert provenance(tmp_path / "data" / "tokens.lance.old") == {"tracked_by": None, "path": "data/tokens.lance.old"}

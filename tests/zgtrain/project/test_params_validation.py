"""Params validation at the edge (property-style): every key of every section, fed a wrong type and an
out-of-range value, ends in one `error:` line naming the key, with a non-zero exit, no traceback and
nothing written. The commands run through the real CLI entry point (`zgtrain.cli.main`) in-process, so
that feeding ~100 bad values stays fast; `test_usage_errors_are_one_line` and the duplicate-key test use
the installed `zg` in a subprocess.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, set_params, tree_sha256
from tests.helpers.runners import zg, zg_main
from zgtrain.cli import main
from zgtrain.project.config import OPTIONAL_SECTIONS, SECTIONS

ALL_SECTIONS = {**SECTIONS, **OPTIONAL_SECTIONS}

# The command that reads each section first.
COMMAND = {
    "teacher": ["teacher", "prepare"],
    "corpus": ["data", "tokenize"],
    "partition": ["teacher", "prepare"],
    "materialize": ["data", "materialize"],
    "verify": ["data", "verify"],
    "train": ["train", "block", "b00"],
    "eval": ["train", "evaluate"],
    "gates": ["train", "evaluate"],
    "lm_eval": ["train", "lm-eval"],
    "local": ["train", "local"],
    "search": ["search", "run"],
    "repair": ["train", "repair"],
    "export": ["pipeline"],  # the export stage's fields: dvc.yaml is written from them
}
WRONG_TYPE = {"int": ["ten", 2.5], "float": ["fast", True], "str": [5], "list": ["x"]}


def _kind(f) -> str:
    return f.type if isinstance(f.type, str) else "Any"


def _out_of_range(f) -> list:
    m = f.metadata
    bad = []
    if m.get("ge") is not None:
        bad.append(m["ge"] - 1 if _kind(f) == "int" else m["ge"] - 0.5)
    if m.get("gt") is not None:
        bad.append(m["gt"])
    if m.get("lt") is not None:
        bad.append(m["lt"])
    if m.get("le") is not None:
        bad.append(m["le"] + 1)
    if m.get("choices"):
        bad.append("bogus")
    return bad


def _cases():
    for sec, cls in ALL_SECTIONS.items():
        for f in fields(cls):
            for v in WRONG_TYPE.get(_kind(f), []):
                yield pytest.param(sec, f.name, v, id=f"{sec}.{f.name}={v!r}")
            for v in _out_of_range(f):
                yield pytest.param(sec, f.name, v, id=f"{sec}.{f.name}={v!r}")
    # registry-checked and cross-field values
    for sec, name, v in (
        ("train", "conversion", "bogus"),
        ("train", "objective", "bogus"),
        ("materialize", "storage_dtype", "float16"),
        ("partition", "boundaries", [4, 2]),
        ("corpus", "heldout", []),
        ("corpus", "source", {"a": 1}),
        ("eval", "window", 1000),
        ("train", "lr", float("nan")),
        ("train", "steps", True),
        ("corpus", "heldout", ["a", 1]),
        ("lm_eval", "tasks", ["hella swag"]),
        ("local", "blocks", "b01"),
        ("eval", "sets", [{"name": "x"}]),
        ("gates", "sets", ["nope"]),
        ("materialize", "virtual_first", "yes"),
        ("export", "enabled", "yes"),
        ("export", "dtype", "q8_0"),  # a GGUF type with export.format hf
        ("export", "out", "../elsewhere"),
        ("search", "limits", "fast"),  # a mapping of cost -> bound
        ("search", "workload", "fast"),  # a mapping of search.workload.KEY
        ("corpus", "sample", "fast"),  # a mapping of corpus.sample.KEY
    ):
        yield pytest.param(sec, name, v, id=f"{sec}.{name}={v!r}")


def test_every_key_is_checked():
    """The cases below cover every field of every section with at least one wrong value."""
    covered = {(c.values[0], c.values[1]) for c in _cases()}
    every = {(sec, f.name) for sec, cls in ALL_SECTIONS.items() for f in fields(cls)}
    assert every - covered == set()


@pytest.fixture(scope="module")
def _shared_project(tiny_built, tmp_path_factory) -> Path:
    return copy_project(tiny_built, tmp_path_factory.mktemp("params") / "proj")


@pytest.fixture
def project(_shared_project) -> Path:
    """One copy of the tiny project per worker for the many bad-value cases (a copy per case cost more than the case);
    each case edits params.yaml only, checks that nothing else changed, and gets the original params.yaml back."""
    params = _shared_project / "params.yaml"
    original = params.read_bytes()
    yield _shared_project
    params.write_bytes(original)


def _run_cli(args, root, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize("sec,name,value", list(_cases()))
def test_bad_value_is_one_line_and_writes_nothing(project, monkeypatch, capsys, sec, name, value):
    set_params(project, {f"{sec}.{name}": value})
    before = tree_sha256(project)
    code, err = _run_cli(COMMAND[sec], project, monkeypatch, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code not in (0, None), err
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"{sec}.{name}" in lines[0], lines[0]
    if name not in ("boundaries", "heldout", "source", "window", "sets"):  # their messages name the rule, not the value
        assert repr(value)[:20] in lines[0] or str(value)[:20] in lines[0], lines[0]
    assert tree_sha256(project) == before


@pytest.mark.parametrize(
    "updates,needle",
    [
        ({"seed": -1}, "seed"),
        ({"seed": "zero"}, "seed"),
        ({"blocks.b00.lr": "fast"}, "blocks.b00.lr"),
        ({"blocks.b00.grad_clip": -1}, "blocks.b00.grad_clip"),
        ({"blocks.b00.bogus": 1}, "blocks.b00.bogus"),
        ({"blocks.b00.window": 0}, "blocks.b00.window"),
        ({"blocks.b00.keep_layers": [[1]]}, "[blocks.b00.keep_layers[0]] blocks.b00.keep_layers[0] is [1]"),
        ({"train.objective": "denoise", "train.normalize": "delta"}, "[train.normalize] train.normalize is 'delta'"),
        ({"trian.lr": 1e-3}, "trian"),
    ],
)
def test_global_and_per_block_keys(project, monkeypatch, capsys, updates, needle):
    set_params(project, updates)
    before = tree_sha256(project)
    code, err = _run_cli(["train", "block", "b00"], project, monkeypatch, capsys)
    assert code not in (0, None) and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert tree_sha256(project) == before


def test_yaml_ambiguous_numbers_are_coerced(tiny_project):
    """`lr: 1e-3` is a string to YAML 1.1; zg reads it as the float it means, and trains."""
    (tiny_project / "params.yaml").write_text(
        (tiny_project / "params.yaml").read_text().replace("lr: 0.001", "lr: 1e-3").replace("steps: 12", "steps: 2")
    )
    assert yaml.safe_load((tiny_project / "params.yaml").read_text())["train"]["lr"] == "1e-3"
    res = zg_main("train", "block", "b00", "--json", cwd=tiny_project)
    assert '"status": "done"' in res.stdout
    meta = yaml.safe_load((tiny_project / "models" / "blocks" / "b00" / "meta.json").read_text())
    assert meta["config"]["lr"] == 0.001 and isinstance(meta["config"]["lr"], float)


def test_duplicate_yaml_key_is_refused(tiny_project):
    path = tiny_project / "params.yaml"
    path.write_text(path.read_text().replace("train:\n", "train:\n  lr: 0.5\n", 1))
    before = tree_sha256(tiny_project)
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "duplicate key 'lr'", "params.yaml")
    assert "line" in line
    assert tree_sha256(tiny_project) == before


@pytest.mark.parametrize(
    "args,needles",
    [
        (["bogus"], ["No such command 'bogus'", "zg --help"]),
        (["train", "block"], ["Missing", "key", "zg train block --help"]),
        (["train", "block", "b00", "--stop-after", "0"], ["--stop-after", "0"]),
        (["train", "block", "b00", "--stop-after", "-1"], ["--stop-after", "-1"]),
        (["data", "verify", "--sample", "0"], ["--sample"]),
        (["train", "block", "b00", "--targets", "somewhere"], ["--targets", "somewhere", "cached, online"]),
        (["train", "lm-eval", "--limit", "-1"], ["--limit", "-1"]),
        (["repro", "--data", "elsewhere"], ["--data", "'elsewhere'", "shared", "remote"]),
        (["repro", "--jobs", "0"], ["--jobs", "greater than or equal to 1"]),
    ],
)
def test_usage_errors_are_one_line(tiny_project, args, needles):
    before = tree_sha256(tiny_project)
    res = zg(*args, cwd=tiny_project, check=False)
    assert_user_error(res, *needles, alone=True)
    assert tree_sha256(tiny_project) == before


def test_zg_params_piped_keeps_every_cell_whole_and_filters_by_key(tmp_path):
    """Piped (not a terminal), `zg params` prints one tab-separated line per key: a long meaning is whole, where a
    table 80 columns wide cut it; KEYS keep the keys and sections named; --json is the same rows; an unknown key is
    one line."""
    import json

    from zgtrain.project.config import params_rows

    rows = params_rows()
    out = zg_main("params", cwd=tmp_path).stdout
    assert [tuple(line.split("\t")) for line in out.splitlines()] == rows
    assert any(len(line) > 200 for line in out.splitlines())  # no cell cut to the table's width
    some = zg_main("params", "train.lr", "corpus.sample", cwd=tmp_path).stdout.splitlines()
    assert [line.split("\t")[0] for line in some] == [
        k for k, *_ in rows if k == "train.lr" or k.startswith("corpus.sample")
    ]
    listed = json.loads(zg_main("params", "repair", "--json", cwd=tmp_path).stdout)
    assert listed == [{"key": k, "default": d, "meaning": m} for k, d, m in rows if k.startswith("repair.")]
    assert_user_error(zg_main("params", "train.nope", cwd=tmp_path, check=False), "no params key or section train.nope")


def test_local_pretraining_refuses_pad_packing(tmp_path):
    """Local pretraining's losses and held-out figures count every position of a row: padded rows would teach the
    model to predict padding, so `zg pipeline` (and every local stage, through ProjectConfig) refuses it."""
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dump_params

    params = profile_params("local-tiny")
    params["corpus"]["packing"] = "pad"
    (tmp_path / "params.yaml").write_text(dump_params(params))
    res = zg_main("pipeline", cwd=tmp_path, check=False)
    assert_user_error(res, "[corpus.packing]", "learn to predict the padding", "packing: eos")
    assert not (tmp_path / "dvc.yaml").exists()


def test_an_eval_window_as_long_as_context_min_pos_is_allowed():
    """The boundary of the eval check: eval.window equal to eval.context_min_pos is accepted (the error's fix says
    window <= context_min_pos), one token longer is refused, naming eval.window."""
    from zgdata.errors import ZgError
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.project.config import ProjectConfig

    params = profile_params("tiny")
    params["eval"].update(window=32, context_min_pos=32)
    ev = ProjectConfig.from_params(params).eval
    assert (ev.window, ev.context_min_pos) == (32, 32)
    params["eval"]["window"] = 33
    with pytest.raises(ZgError, match="need 1 <= window <= context_min_pos") as e:
        ProjectConfig.from_params(params)
    assert e.value.key == "eval.window"

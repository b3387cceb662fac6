"""A malformed input is refused with one line naming the file and what to do, never a traceback."""

from __future__ import annotations

import struct

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.store.lance_io import open_dataset
from zgdata.store.reader import BoundaryDataset


def test_a_non_utf8_byte_in_params_yaml_is_one_line(tiny_project):
    params = tiny_project / "params.yaml"
    params.write_bytes(params.read_bytes() + b"# caf\xe9\n")
    res = zg_main("data", "tokenize", cwd=tiny_project, check=False)
    assert_user_error(res, "params.yaml is not UTF-8 text: byte 0xe9 at line", "save it as UTF-8")


def test_an_invalid_teacher_slice_header_is_one_line(tiny_project):
    path = tiny_project / "models" / "teacher" / "blocks" / "b00.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[:8] + b"\xff" * n + data[8 + n :])  # same length, not JSON
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "b00.safetensors is not a valid safetensors file: its header is not JSON", "dvc checkout")
    path.write_bytes(struct.pack("<Q", 2**62) + data[8:])
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, f"declares a {2**62}-byte header in a {len(data)}-byte file")


# dvc.lock (or a .dvc file) that is YAML but not what DVC writes: each is git's record, so it is refused in one line
# naming it, never skipped (a record that cannot be read must not switch the check off)
BAD_LOCKS = {
    "not-yaml": ("stages: [", "dvc.lock is not a readable DVC file"),
    "a-string": ("hello", "dvc.lock is not what DVC writes (a YAML str, not a mapping)"),
    "stages-a-list": ("stages: [1]", "dvc.lock is not what DVC writes: its stages are not a mapping"),
    "outs-a-number": ("stages: {materialize: {outs: 5}}", "dvc.lock's stage materialize is not what DVC writes"),
    "an-out-a-number": ("stages: {materialize: {outs: [7]}}", "its outs is not a list of entries"),
}


@pytest.mark.parametrize("case", list(BAD_LOCKS))
def test_a_dvc_lock_of_another_shape_is_one_line_in_verify_and_inspect(tiny_project, case):
    text, says = BAD_LOCKS[case]
    (tiny_project / "dvc.lock").write_text(text + "\n")
    for args in (("data", "verify", "--lineage-only"), ("data", "inspect", "data/boundaries/h02.lance")):
        assert_user_error(zg_main(*args, cwd=tiny_project, check=False), says, "git checkout dvc.lock")


def test_a_dvc_file_of_another_shape_is_one_line_in_inspect(tiny_project):
    dvcfile = tiny_project / "data" / "boundaries" / "h04.lance.dvc"
    for text, says in (("outs: [", "is not a readable DVC file"), ("deps: 5", "its deps is not a list of entries")):
        dvcfile.write_text(text + "\n")
        res = zg_main("data", "inspect", "data/boundaries", cwd=tiny_project, check=False)
        assert_user_error(res, "data/boundaries/h04.lance.dvc", says, "git checkout data/boundaries/h04.lance.dvc")


def test_a_command_run_from_a_project_subfolder_names_the_root_to_run_from(tiny_project, tmp_path):
    """Every zg command reads params.yaml and data/ from the folder it runs in: from a subfolder the error says
    where the project's root is (it said only "create one with `zg init`" or "run `dvc repro` first"); outside any
    project it does not."""
    sub = tiny_project / "notes" / "week1"
    sub.mkdir(parents=True)
    for args, what in (
        (("pipeline",), "params.yaml not found"),
        (("data", "inspect"), "data/tokens.lance does not exist"),
    ):
        res = zg_main(*args, cwd=sub, check=False)
        assert_user_error(res, what, f"inside the project at {tiny_project.absolute()}; zg's project commands run")
        assert f"`cd {tiny_project.absolute()}`" in res.stderr, res.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = zg_main("pipeline", cwd=elsewhere, check=False)
    assert_user_error(res, "params.yaml not found")
    assert "inside the project" not in res.stderr, res.stderr


def test_a_dataset_of_the_other_kind_is_refused_by_its_kind(tiny_built):
    """A boundary opened as tokens, or the tokens dataset given where a boundary is read, is refused by what it is
    (its schema's zg.kind), not read as the other kind's columns."""
    layout = Layout(tiny_built)
    h02 = layout.boundary("h02")
    with pytest.raises(ZgError, match=r"is not a ZeroGraph tokens dataset \(kind='boundary'\)") as e:
        open_dataset(h02, kind="tokens")
    assert str(h02) in str(e.value)
    with pytest.raises(ZgError, match=r"is not a ZeroGraph boundary dataset \(kind='tokens'\)") as e:
        BoundaryDataset(layout.tokens)
    assert str(layout.tokens) in str(e.value)
    assert len(open_dataset(h02, kind="boundary").to_table(columns=["seq_id"])) == 56  # the right kind opens

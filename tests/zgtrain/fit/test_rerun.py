"""The advice of a refusal names the command and stage of the folder it read (zgtrain/fit/rerun.py): a damaged
variant, local block or search-repair checkpoint does not send its user to `zg train block`, whose --restart would
not touch it. Every command named exists in `zg`'s help; every stage, in the dvc.yaml `zg pipeline` writes."""

from __future__ import annotations

import pytest

from zgdata.errors import ZgError
from zgdata.store.integrity import recover_fix
from zgtrain.cli_help import PAGES
from zgtrain.fit.checkpoint import check_checkpoint, reload_fix
from zgtrain.fit.rerun import model_of, rerun_of

RUNS = [
    # folder (or a file or checkpoint inside it) -> (command, stage, the folder `dvc checkout` restores)
    ("models/blocks/b01", "zg train block b01 --restart", "train@b01", "models/blocks/b01"),
    ("models/blocks/.b01.staging/ckpt-000004", "zg train block b01 --restart", "train@b01", "models/blocks/b01"),
    ("models/variants/b00/p50", "zg train variant b00 p50 --restart", "variant@b00-p50", "models/variants/b00/p50"),
    (
        "models/variants/b00/.p50.staging",
        "zg train variant b00 p50 --restart",
        "variant@b00-p50",
        "models/variants/b00/p50",
    ),
    (
        "models/local/blocks/b02/ckpt-000010",
        "zg train local-block b02 --restart",
        "local_b02",
        "models/local/blocks/b02",
    ),
    ("models/local/run/ckpt-000010/b01", "zg train local --restart", "local", "models/local"),
    ("models/repair", "zg train repair --restart", "repair", "models/repair"),
    ("models/search/repair", "zg search repair --restart", "search_repair", "models/search/repair"),
    ("models/student", "zg train assemble", "assemble", "models/student"),
    ("models/repaired", "zg train repair --restart", "repair", "models/repaired"),
    ("models/search/student", "zg search assemble", "search_assemble", "models/search/student"),
    ("models/local/hf", "zg train local-export", "local_export", "models/local/hf"),
    ("elsewhere/b07", "zg train block b07 --restart", "train@b07", "models/blocks/b07"),  # outside models/: a block's
]


@pytest.mark.parametrize("folder, command, stage, restores", RUNS)
def test_each_folder_names_its_own_command_stage_and_folder(folder, command, stage, restores, tmp_path):
    r = rerun_of(tmp_path / "proj" / folder)
    assert (r.restart, r.stage, r.folder) == (command, stage, restores)
    page = PAGES[" ".join(command.split()[:3])]  # the command exists, and takes --restart where it is given
    if command.endswith("--restart"):
        assert "--restart" in page


def test_a_project_under_a_folder_named_models_is_read_from_its_own_models_folder():
    assert rerun_of("/srv/models/team/proj/models/variants/b03/kv2").stage == "variant@b03-kv2"


def test_a_model_folder_elsewhere_is_taken_as_the_students():
    assert model_of("/tmp/my-student").stage == "assemble"
    assert model_of("proj/models/search/student").stage == "search_assemble"
    assert model_of("proj/models/blocks/b00").stage == "assemble"  # not a model folder


def test_a_damaged_variant_checkpoint_names_the_variant_command(tmp_path):
    """The refusal itself, from the checkpoint code every trainer shares."""
    c = tmp_path / "proj" / "models" / "variants" / "b01" / "window64" / "ckpt-000004"
    c.mkdir(parents=True)
    with pytest.raises(ZgError) as e:
        check_checkpoint(c, {"checkpoint_sha256": {"model.safetensors": "0" * 64}})
    assert "is missing" in e.value.what
    assert e.value.fix == (
        "rerun with `zg train variant b01 window64 --restart` (or restore the folder: "
        "`dvc checkout --force models/variants/b01/window64`)"
    )
    assert "`dvc checkout --force models/search/repair`" in reload_fix(tmp_path / "models" / "search" / "repair")


def test_a_damaged_local_boundary_is_recreated_by_its_local_stage():
    fix = recover_fix("data/local/h04.lance", "local_boundary")
    assert "dvc checkout --force data/local/h04.lance" in fix and "dvc repro -f local_bNN" in fix
    assert "materialize" not in fix
    assert recover_fix("data/boundaries/h04.lance", "boundary").endswith("`dvc repro -f materialize`")
    assert recover_fix("data/tokens.lance", "tokens").endswith("`dvc repro -f tokens`")

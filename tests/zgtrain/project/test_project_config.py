"""zgtrain/project/config.py and the profiles: ProjectConfig parses params once; defaults live only in the
dataclasses; names are checked against their registries (pure, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zgdata.config import ProjectKind, defaults
from zgdata.errors import ZgError
from zgtrain.block import conversions
from zgtrain.pipeline.profiles import PROFILES, profile_params
from zgtrain.pipeline.scaffold import regenerate
from zgtrain.pipeline.stages import dump_params
from zgtrain.project.config import ProjectConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[3]


def test_root_params_yaml_is_the_generated_default_profile():
    assert (ROOT / "params.yaml").read_text() == dump_params(profile_params("smollm2"))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profiles_are_overrides_of_the_defaults(profile):
    params = profile_params(profile)
    project = ProjectConfig.from_params(params)
    for section, over in PROFILES[profile].items():
        if section == "variants":  # {name: TrainConfig}: train: with the variant's own overrides
            assert list(project.variants) == list(over)
            assert all(getattr(project.variants[n], k) == v for n, o in over.items() for k, v in o.items())
            continue
        for key, value in over.items():
            assert getattr(getattr(project, section), key) == value, (section, key)
    # a local-pretraining profile trains its partition's blocks from `local:`, with no per-block overrides
    local = project.kind is ProjectKind.LOCAL
    assert local == ("local" in PROFILES[profile])
    assert list(project.blocks) == ([] if local else [b.key for b in project.partition.blocks()])


def test_blocks_inherit_train_and_override_it():
    params = profile_params("tiny")
    params["blocks"]["b01"]["lr"] = "2e-3"
    project = ProjectConfig.from_params(params)
    assert project.block("b00").train == project.train
    assert project.block("b01").train.lr == 0.002 and project.block("b01").train.steps == project.train.steps
    assert (project.block("b01").spec.input, project.block("b01").spec.output) == ("h02", "h04")
    with pytest.raises(ZgError, match="block 'b07' is not in params.yaml blocks"):
        project.block("b07")


@pytest.mark.parametrize(
    "mutate,key",
    [
        (lambda p: p["blocks"]["b00"].update(lr=-1), "blocks.b00.lr"),
        (lambda p: p["blocks"]["b00"].update(nope=1), "blocks.b00"),
        (lambda p: p["blocks"]["b00"].update(out="h04"), "blocks.b00"),
        (lambda p: p.update(extra={}), "extra"),
        (lambda p: p.update(seed=1.5), "seed"),
        (lambda p: p["train"].update(conversion="nope"), "train.conversion"),
        (lambda p: p["train"].update(objective="nope"), "train.objective"),
    ],
)
def test_bad_project_params_name_their_key(mutate, key):
    params = profile_params("tiny")
    mutate(params)
    with pytest.raises(ZgError) as e:
        ProjectConfig.from_params(params)
    assert e.value.key == key


def test_a_new_conversion_is_one_registered_function():
    assert "halve" not in conversions.CONVERSIONS
    with pytest.raises(ZgError, match="train.conversion"):
        TrainConfig(conversion="halve")

    @conversions.register("halve")
    def halve(tensors, config, cfg, sample, gen):  # pragma: no cover - only registered, never run here
        raise AssertionError

    try:
        assert TrainConfig(conversion="halve").conversion == "halve"
        assert "halve" in yaml.safe_dump(list(conversions.CONVERSIONS))
    finally:
        del conversions.CONVERSIONS["halve"]


def test_load_reads_the_file(tmp_path):
    (tmp_path / "params.yaml").write_text(dump_params(profile_params("tiny")))
    assert ProjectConfig.load(tmp_path / "params.yaml") == ProjectConfig.from_params(profile_params("tiny"))
    with pytest.raises(ZgError, match="not found"):
        ProjectConfig.load(tmp_path / "missing.yaml")


def test_regenerate_refits_blocks_to_the_partition_and_writes_nothing_from_invalid_params(tmp_path):
    """What `zg pipeline` does: blocks: follow partition.boundaries, each keeping its own train overrides."""
    params = profile_params("tiny")
    params["blocks"]["b01"]["lr"] = 0.002
    params["partition"]["boundaries"] = [0, 1, 4]
    path = tmp_path / "params.yaml"
    path.write_text(dump_params(params))
    dvc, project = regenerate(path)
    assert dvc == tmp_path / "dvc.yaml" and project.kind is ProjectKind.CONVERT
    assert (project.block("b01").spec.input, project.block("b01").overrides) == ("h01", ("lr",))
    assert yaml.safe_load(path.read_text())["blocks"]["b01"] == {"lr": 0.002, "in": "h01", "out": "h04"}
    params = yaml.safe_load(path.read_text())
    params["train"]["lr"] = -1
    path.write_text(dump_params(params))
    before = (path.read_text(), dvc.read_text())
    with pytest.raises(ZgError) as e:
        regenerate(path)
    assert e.value.key == "train.lr" and (path.read_text(), dvc.read_text()) == before


def test_regenerate_writes_the_defaults_of_the_keys_dvc_yaml_lists(tmp_path):
    """A hand-written params.yaml may leave out train keys (they take their defaults); dvc.yaml lists them one by
    one (a checkpoint's period left out), and DVC refuses a listed key that params.yaml lacks, so `zg pipeline`
    writes the missing ones with their defaults and keeps the ones given."""
    params = profile_params("tiny")
    params["train"] = {"steps": 3, "lr": 0.002}
    path = tmp_path / "params.yaml"
    path.write_text(dump_params(params))
    dvc, _ = regenerate(path)
    train = yaml.safe_load(path.read_text())["train"]
    assert train == {**defaults(TrainConfig), "steps": 3, "lr": 0.002}
    listed = yaml.safe_load(dvc.read_text())["stages"]["train"]["do"]["params"]
    keys = [k.split(".", 1)[1] for k in listed if k.startswith("train.")]
    assert set(keys) == set(train) - {"checkpoint_every"} and "seed" in listed


def test_init_without_git_on_path_is_one_line_and_a_rerun_works(tmp_path, monkeypatch):
    """`zg init` where `git` is not on PATH: one error line naming it (no traceback), exit 2; once PATH has it,
    the same command in the same folder succeeds. (DVC's part runs in zg's process: `dvc` need not be on PATH.)"""
    import os

    from tests.helpers.assertions import assert_user_error
    from tests.helpers.runners import zg_main

    bare = tmp_path / "bin"
    bare.mkdir()  # neither git nor dvc
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(bare))
    res = zg_main("init", tmp_path / "proj", "--profile", "tiny", cwd=tmp_path, check=False)
    assert res.returncode == 2
    assert_user_error(res, "`git` is not on PATH", "install git", alone=True)
    assert not (tmp_path / "proj" / "params.yaml").exists()
    monkeypatch.setenv("PATH", path)
    zg_main("init", tmp_path / "proj", "--profile", "tiny", cwd=tmp_path)
    assert (tmp_path / "proj" / "dvc.yaml").is_file() and (tmp_path / "proj" / ".dvc").is_dir()


def test_init_sets_up_dvc_as_its_cli_does(tmp_path):
    """`zg init` sets DVC up in its own process; the files are those of `dvc init -q` and `dvc config cache.type
    reflink,copy` run as commands in another repository, and git has them staged alike."""
    import subprocess

    from tests.helpers.runners import run, zg_main

    zg_main("init", tmp_path / "proj", "--profile", "tiny", cwd=tmp_path)
    cli = tmp_path / "cli"
    cli.mkdir()
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "cache.type", "reflink,copy"]):
        run(cmd, cwd=cli)
    for name in (".dvc/config", ".dvc/.gitignore"):
        assert (tmp_path / "proj" / name).read_bytes() == (cli / name).read_bytes(), name
    assert (tmp_path / "proj" / ".dvc" / "config").read_text() == '[cache]\n    type = "reflink,copy"\n'

    def staged(root):
        out = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=root, capture_output=True, text=True)
        return set(out.stdout.split())

    assert {".dvc/config", ".dvc/.gitignore", ".dvcignore"} <= staged(tmp_path / "proj")
    assert staged(cli) == {".dvc/config", ".dvc/.gitignore", ".dvcignore"}


def test_init_where_dvcs_config_is_broken_is_one_line_and_writes_nothing(tmp_path):
    """A folder whose .dvc/config DVC cannot parse: `zg init` names DVC's complaint in one error line (exit 2) and
    leaves the folder as it was (no params.yaml, dvc.yaml, ignore files; the config untouched)."""
    from tests.helpers.assertions import assert_user_error
    from tests.helpers.projects import tree_sha256
    from tests.helpers.runners import run, zg_main

    root = tmp_path / "proj"
    (root / ".dvc").mkdir(parents=True)
    run(["git", "init", "-q"], cwd=root)
    (root / ".dvc" / "config").write_text("[core\nbroken = ")
    before = tree_sha256(root)
    res = zg_main("init", root, "--profile", "tiny", cwd=tmp_path, check=False)
    assert res.returncode == 2
    assert_user_error(res, f"DVC could not set up {root}", "config file error", alone=True)
    assert tree_sha256(root) == before

"""zgtrain/pipeline/current.py: a pipeline that `zg pipeline` did not regenerate after a params edit is refused by
name, by `zg repro` and by every stage command that DVC starts, before the stage does any work."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from tests.helpers.projects import set_params
from tests.helpers.runners import run, zg, zg_main
from zgdata.errors import ZgError
from zgtrain.pipeline.current import check, differences
from zgtrain.pipeline.profiles import profile_params
from zgtrain.pipeline.scaffold import regenerate
from zgtrain.pipeline.stages import HEADER, dump_params


@pytest.fixture
def project(tmp_path):
    """A tiny project's params.yaml and the dvc.yaml `zg pipeline` writes from it (no git, no data)."""
    (tmp_path / "params.yaml").write_text(dump_params(profile_params("tiny")))
    regenerate(tmp_path / "params.yaml")
    return tmp_path


def _stages(root) -> dict:
    return yaml.safe_load((root / "dvc.yaml").read_text())["stages"]


def _write_stages(root, stages: dict) -> None:
    """STAGES as dvc.yaml, under the header `zg pipeline` writes (a hand edit keeps it)."""
    (root / "dvc.yaml").write_text(HEADER + yaml.safe_dump({"stages": stages}, sort_keys=False))


def test_a_regenerated_pipeline_is_current_and_so_is_a_value_edit(project):
    assert differences(project) == []
    set_params(project, {"train.lr": 0.01, "blocks.b01.steps": 7, "seed": 3})  # what `dvc exp run -S` sets
    assert differences(project) == []
    check(project)


def test_a_partition_edit_names_the_generated_parts_it_leaves_stale(project):
    before = _stages(project)
    set_params(project, {"partition.boundaries": [0, 1, 2, 4]})
    found = differences(project)
    regenerate(project / "params.yaml")
    after = _stages(project)
    # what `zg pipeline` then changed, stage by stage, is what was named: no more, no less
    assert found == ["params.yaml blocks"] + [f"stage {n} changed" for n in before if before[n] != after[n]]
    assert "stage materialize changed" in found and "stage assemble changed" in found  # h01 is new; b02 is new
    assert differences(project) == []


def test_a_stage_params_turn_on_is_missing_until_regenerated(project):
    set_params(project, {"repair.steps": 3})
    assert "stage repair missing" in differences(project)
    with pytest.raises(ZgError) as e:
        check(project)
    assert "stage repair missing" in str(e.value) and "`zg pipeline`" in e.value.render()
    regenerate(project / "params.yaml")
    assert "repair" in _stages(project) and differences(project) == []


def test_hand_edits_of_zg_stages_are_named_and_the_users_own_stages_are_left_alone(project):
    stages = _stages(project)
    stages["report"] = {"cmd": "python report.py", "deps": ["reports/eval.json"], "outs": ["report.html"]}
    _write_stages(project, stages)
    assert differences(project) == []
    stages["evaluate"]["deps"] = stages["evaluate"]["deps"][:-1]
    stages["old_repair"] = {"cmd": "zg train repair", "outs": ["models/repaired"]}
    _write_stages(project, stages)
    assert differences(project) == ["stage evaluate changed", "stage old_repair not in params"]


def test_a_listed_key_removed_from_params_is_named(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    del params["train"]["lr"]  # dvc.yaml lists train.lr: DVC would refuse the stage for the missing key
    (project / "params.yaml").write_text(dump_params(params))
    assert differences(project) == ["params.yaml train"]


def test_a_pipeline_zg_did_not_write_is_not_checked(tmp_path):
    """Another project's stage may run a `zg` command (`zg data verify` of imported boundaries) beside its own
    params.yaml and dvc.yaml: no zg header, no check."""
    assert differences(tmp_path) == []  # no dvc.yaml
    (tmp_path / "params.yaml").write_text("lr: 0.1\n")
    stages = {"verify": {"cmd": "zg data verify data/h02.lance", "deps": ["data/h02.lance"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert differences(tmp_path) == []
    _write_stages(tmp_path, stages)  # the same with zg's header: zg's project, whose params are not zg's
    with pytest.raises(ZgError):
        differences(tmp_path)


def test_dvc_repro_and_zg_repro_refuse_a_stale_graph_and_dvc_checkout_restores(reproduced, tmp_path):
    """The real thing: a partition edit without `zg pipeline`, then `dvc repro` and `zg repro` in a reproduced
    project. DVC starts the first stage the edit changed (teacher, whose slices follow the partition); its command
    refuses before writing anything, so no stage after it runs and nothing is recorded; the stage's committed outputs,
    which DVC removed before the command ran, come back with `dvc checkout`."""
    root = shutil.copytree(reproduced, tmp_path / "proj", symlinks=True)
    lock = (root / "dvc.lock").read_bytes()
    set_params(root, {"partition.boundaries": [0, 1, 2, 4]})
    res = run(["dvc", "repro"], cwd=root, check=False)
    assert res.returncode != 0
    assert "dvc.yaml is out of date with params.yaml (params.yaml blocks" in res.stdout + res.stderr
    assert re.findall(r"Running stage '([^']+)'", res.stdout) == ["teacher"]  # its slices follow the partition
    assert (root / "dvc.lock").read_bytes() == lock
    bad = zg("repro", cwd=root, check=False)
    assert bad.returncode != 0 and "dvc.yaml is out of date" in bad.stderr and "zg pipeline" in bad.stderr
    run(["git", "checkout", "params.yaml"], cwd=root)
    run(["dvc", "checkout", "-q"], cwd=root)
    assert run(["dvc", "status", "-q"], cwd=root, check=False).returncode == 0
    zg_main("pipeline", cwd=root)  # an unedited project regenerates to the same files
    assert run(["git", "status", "--porcelain", "dvc.yaml", "params.yaml"], cwd=root).stdout == ""

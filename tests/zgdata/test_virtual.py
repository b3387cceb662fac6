"""A virtual first boundary (materialize.virtual_first): h00 is not stored, every reader
recomputes it from data/tokens.lance and the head slice's embedding, bit-identical to the stored one, and
train@b00 depends on those files (traced with strace) and trains to the same state_sha256."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
import yaml

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import zg_main
from tests.helpers.stage_deps import pipeline_stages, trace_stage, undeclared
from tests.helpers.stage_trace import STRACE
from zgdata.boundaries import open_boundary
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.inspect import collect
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.materialize.virtual import VirtualBoundary
from zgdata.store.reader import BoundaryDataset
from zgtrain.pipeline.stages import write_pipeline
from zgtrain.project.config import ProjectConfig


def _virtual(root) -> VirtualBoundary:
    params = yaml.safe_load((root / "params.yaml").read_text())
    return VirtualBoundary(Layout(root), section(params, MaterializeConfig, "materialize"))


@pytest.mark.long
def test_virtual_h00_is_bitwise_the_stored_one_and_trains_b00_to_the_same_state(tiny_project, tmp_path):
    root, layout = tiny_project, Layout(tiny_project)
    zg_main("train", "block", "b00", cwd=root)
    want = read_json(layout.block_dir("b00") / "meta.json")["state_sha256"]

    params = edit_params(root, materialize={"virtual_first": True})
    write_pipeline(root, ProjectConfig.from_params(params), code_deps=False)  # what `zg pipeline` does
    shutil.move(layout.boundary("h00"), tmp_path / "h00.lance")  # a virtual project never has it
    stored = BoundaryDataset(tmp_path / "h00.lance", recheck=True)
    res = materialize(section(params, MaterializeConfig), section(params, PartitionConfig), layout=layout)
    assert res.skipped and list(res.paths) == ["h02", "h04"] and not layout.boundary("h00").exists()

    virt = _virtual(root)
    rows = np.random.default_rng(0).permutation(len(stored.seq_ids))  # any order, as training asks
    assert torch.equal(virt.take(rows), stored.take(rows))
    assert virt.take(rows).dtype == torch.bfloat16
    assert virt.fingerprint == stored.fingerprint and np.array_equal(virt.seq_ids, stored.seq_ids)
    assert np.array_equal(virt.rows("heldout"), stored.rows("heldout"))
    lin = virt.meta["lineage"]
    assert lin["virtual"] is True and len(lin["embedding_sha256"]) == 64
    assert lin["computed_from"] == ["data/tokens.lance", "models/teacher/blocks/head.safetensors"]
    # the public API opens the absent path of a virtual h00
    pub = open_boundary(layout.boundary("h00"))
    assert pub.codec == "virtual" and torch.equal(pub.take([5, 0]), stored.take([5, 0]))
    assert torch.equal(pub.tokens_dataset("train")[70], stored.take(stored.rows("train")[1:2])[0, 6])
    here = os.getcwd()
    try:  # ... a relative path too, from inside the boundaries folder (it pointed at `dvc checkout h00.lance`)
        os.chdir(layout.boundaries_dir)
        assert torch.equal(open_boundary("h00.lance").take([5, 0]), stored.take([5, 0]))
    finally:
        os.chdir(here)

    # dvc.yaml: no h00 out; train@b00 reads the tokens and the head slice, and nothing undeclared
    stages = pipeline_stages(root)
    assert "data/boundaries/h00.lance" not in stages["materialize"]["outs"]
    b00 = stages["train@b00"]
    assert b00["deps"][:2] == ["data/tokens.lance", "models/teacher/blocks/head.safetensors"]
    assert not any("h00" in d for s in stages.values() for d in s.get("deps", []))
    shutil.rmtree(layout.block_dir("b00"))
    if STRACE:
        read = trace_stage(root, b00, tmp_path / "b00.strace")
        assert any(p.startswith("data/tokens.lance/") for p in read), sorted(read)
        assert "models/teacher/blocks/head.safetensors" in read
        assert undeclared(b00, read) == []
    else:
        zg_main("train", "block", "b00", cwd=root)
    assert read_json(layout.block_dir("b00") / "meta.json")["state_sha256"] == want

    # verify recomputes the virtual h00 with the teacher; inspect says what it is made of
    rep = zg_main("data", "verify", "--json", cwd=root)
    report = yaml.safe_load(rep.stdout)
    assert report["status"] == "ok" and report["boundaries"]["h00"]["virtual"] is True, report
    assert report["boundaries"]["h00"]["fingerprint"] == stored.fingerprint
    info = {i["name"]: i for i in collect([layout.boundaries_dir])}
    assert info["h00"]["codec"] == "virtual" and info["h00"]["lineage"]["embedding_sha256"] == lin["embedding_sha256"]
    assert "head.safetensors" in info["h00"]["source"]["virtual"]


def test_virtual_h00_without_the_head_slice_is_a_user_error(tiny_project):
    root, layout = tiny_project, Layout(tiny_project)
    edit_params(root, materialize={"virtual_first": True})
    shutil.rmtree(layout.boundary("h00"))
    layout.teacher_head.unlink()
    before = tree_sha256(root / "data")
    res = zg_main("train", "block", "b00", cwd=root, check=False)
    assert_user_error(res, "head.safetensors", "dvc pull")
    assert tree_sha256(root / "data") == before and not layout.block_dir("b00").exists()


@pytest.mark.parametrize("profile", ["tiny", "smollm2"])
def test_virtual_first_changes_only_h00_stages(profile):
    """Off in the tiny profile (and the key's default); on in the default conversion (smollm2)."""
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dvc_yaml

    params = profile_params(profile)
    assert params["materialize"]["virtual_first"] is (profile == "smollm2")
    params["materialize"]["virtual_first"] = False
    off = dvc_yaml(ProjectConfig.from_params(params), code_deps=True)["stages"]
    assert off["train"]["foreach"] == "${blocks}" and "data/boundaries/h00.lance" in off["materialize"]["outs"]
    params["materialize"]["virtual_first"] = True
    on = dvc_yaml(ProjectConfig.from_params(params), code_deps=True)["stages"]
    assert on["materialize"]["outs"] == off["materialize"]["outs"][1:]
    assert "materialize.virtual_first" in on["materialize"]["params"]
    assert {k: v for k, v in on.items() if k not in ("materialize", "verify", "train", "evaluate")} == {
        k: v for k, v in off.items() if k not in ("materialize", "verify", "train", "evaluate")
    }
    items = on["train"]["foreach"]
    assert (items["b00"]["src"], items["b00"]["aux"]) == ("data/tokens.lance", "models/teacher/blocks/head.safetensors")
    assert items["b01"]["src"] == items["b01"]["aux"] == f"data/boundaries/{items['b01']['in']}.lance"
    assert (
        "zgdata/materialize/virtual.py" in on["train"]["do"]["deps"]
        and "zgdata/materialize/virtual.py" not in off["train"]["do"]["deps"]
    )


def test_remote_workers_pull_what_train_at_b00_declares():
    """zg repro --data remote: a worker pulls exactly the stage's data deps (zgtrain/exec/scratch.py)."""
    from zgtrain.exec.scratch import _inputs
    from zgtrain.pipeline.profiles import profile_params
    from zgtrain.pipeline.stages import dvc_yaml
    from zgtrain.project.config import ProjectConfig

    params = profile_params("tiny")
    params["materialize"]["virtual_first"] = True
    project = ProjectConfig.from_params(params)
    train = dvc_yaml(project, code_deps=False)["stages"]["train"]
    for key, item in train["foreach"].items():
        deps = [
            d.replace("${key}", key)
            .replace("${item.src}", item["src"])
            .replace("${item.aux}", item["aux"])
            .replace("${item.out}", item["out"])
            for d in train["do"]["deps"]
        ]
        assert sorted(set(deps)) == sorted(_inputs(project, key)), key
    assert _inputs(project, "b00")[:2] == ["data/tokens.lance", "models/teacher/blocks/head.safetensors"]


def test_take_refuses_the_row_number_one_past_the_end(tiny_project):
    """Row numbers are 0..n-1 for n rows: row n is out of range and must be refused with an IndexError naming the
    range [0, n), while row n-1, the last row, is read like any other."""
    vb = _virtual(tiny_project)
    n = len(vb.seq_ids)
    with pytest.raises(IndexError, match=rf"row numbers must be in \[0, {n}\)"):
        vb.take([n])
    assert tuple(vb.take([n - 1]).shape) == (1, vb.seq_len, vb.hidden)

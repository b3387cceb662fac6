"""Greedy local pretraining: the local-tiny profile from `zg init` through `dvc repro`, then the
simultaneous mode's guarantees on it.

The reference is the profile's own `dvc repro` (K=2, mlp aux, no MTP, phased, 8 steps, checkpoint every
4). Bitwise claims compare ``state_sha256`` (every block's weights + AdamW state) and the saved model's
tensors with torch.equal. Runs that vary one setting call the same function as `zg train local`
in-process on a copy of the project (real Lance tokens, real checkpoints on disk); the kill test and
the user errors go through the real CLI.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import load_params_of, project_of, read_json, set_params, tree_sha256
from tests.helpers.runners import kill_after_first_checkpoint, run, zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.local.simultaneous import train_local
from zgtrain.pipeline.profiles import profile_params

KEYS = ["b00", "b01"]


@pytest.fixture(scope="module")
def local_repro(tmp_path_factory):
    """`zg init --profile local-tiny`, a commit, `dvc repro` of every stage, a commit: (root, metrics)."""
    base = tmp_path_factory.mktemp("local")
    root = base / "proj"
    zg_main("init", root, "--profile", "local-tiny", cwd=base)
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "zg init"], cwd=root)
    res = run(["dvc", "repro"], cwd=root)
    assert "Running stage 'local'" in res.stdout, res.stdout
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "dvc repro"], cwd=root)
    return root, read_json(root / "metrics" / "local.json")


def _copy(root, dst, updates: dict | None = None):
    """A copy of the reproduced project without its local run, with params ``updates`` (blocks: regenerated)."""
    shutil.copytree(root, dst, symlinks=True)
    shutil.rmtree(dst / "models" / "local")
    if updates:
        set_params(dst, updates)
        zg_main("pipeline", cwd=dst)
    return dst


def _train(root, **kw) -> dict:
    """train_local's result as metrics/local.json holds it (a stopped run: its status, step and hashes)."""
    return train_local(project_of(root), layout=Layout(root), **kw).metrics()


def _weights(root) -> dict:
    return load_file(str(root / "models" / "local" / "hf" / "model.safetensors"))


def _batches(root) -> list[list[str]]:
    """Per block, the digest of each step's batch as recorded in its last checkpoint's curve."""
    meta = read_json(root / "models" / "local" / "run" / "meta.json")
    ckpt = root / "models" / "local" / "run" / meta["checkpoint"]
    return [[c["batch"] for c in read_json(next((ckpt / k).glob("ckpt-*")) / "curve.json")] for k in meta["keys"]]


def test_profile_runs_from_init_through_dvc_repro(local_repro):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, m = local_repro
    params = load_params_of(root)
    assert "local" in params and "local" not in profile_params("tiny") and "local" not in profile_params("smollm2")
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert set(stages) == {"teacher", "tokens", "local"} and stages["teacher"]["params"] == ["teacher"]
    assert not (root / "models" / "teacher" / "blocks").exists()  # the teacher gives its tokenizer only
    assert m["status"] == "done" and m["step"] == m["steps"] == 8 and m["k"] == 2
    assert 0 < m["heldout_ce"] < 8 and m["heldout_tokens"] > 0
    # the saved transformers folder scores what the last block's own forward scores
    assert abs(m["block_ce"]["b01"] - m["heldout_ce"]) < 1e-4
    model = AutoModelForCausalLM.from_pretrained(root / "models" / "local" / "hf")
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 4
    assert not model.config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(root / "models" / "local" / "hf")("ab")["input_ids"]
    assert m["local_params"] > 0  # b00's auxiliary head, not in the saved model
    assert "Data and pipelines are up to date" in run(["dvc", "status"], cwd=root).stdout


def test_kill_9_then_resume_is_bitwise_identical(local_repro, tmp_path):
    ref_root, ref = local_repro
    root = _copy(ref_root, tmp_path / "proj")
    meta_path = root / "models" / "local" / "run" / "meta.json"
    kill_after_first_checkpoint(["train", "local"], root, meta_path, tmp_path / "killed.stderr")
    meta = read_json(meta_path)
    assert meta["done"] is False and meta["step"] == 4
    assert sorted(p.name for p in (meta_path.parent / meta["checkpoint"]).iterdir()) == KEYS
    assert not (root / "models" / "local" / "hf").exists()

    resumed = json.loads(zg_main("train", "local", "--json", cwd=root).stdout)
    assert resumed["status"] == "done"
    assert resumed["state_sha256"] == ref["state_sha256"]
    assert resumed["block_state_sha256"] == ref["block_state_sha256"]
    assert (root / "plots" / "local" / "loss.csv").read_text() == (
        ref_root / "plots" / "local" / "loss.csv"
    ).read_text()
    # every block's checkpoint of the same step, nothing half-written left
    assert sorted(p.name for p in (root / "models" / "local" / "run").iterdir()) == ["ckpt-000008", "meta.json"]


def test_early_backward_is_bitwise_equal_to_phased_and_resumes_across_schedules(local_repro, tmp_path):
    ref_root, ref = local_repro
    root = _copy(ref_root, tmp_path / "early", {"local.schedule": "early_backward"})
    r = _train(root)
    assert r["schedule"] == "early_backward" and r["state_sha256"] == ref["state_sha256"]
    a, b = _weights(ref_root), _weights(root)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the schedule is not part of the run's identity: stop under one, resume under the other
    mixed = _copy(ref_root, tmp_path / "mixed")
    assert _train(mixed, stop_after=3)["status"] == "stopped"
    set_params(mixed, {"local.schedule": "early_backward"})
    assert _train(mixed)["state_sha256"] == ref["state_sha256"]


def test_schedules_agree_with_a_transformer_aux_head_and_mtp_everywhere(local_repro, tmp_path):
    ref_root, ref = local_repro
    over = {"local.aux": "transformer", "local.mtp": "all", "local.mtp_depth": 3}
    runs = [_train(_copy(ref_root, tmp_path / s, {**over, "local.schedule": s})) for s in ("phased", "early_backward")]
    assert runs[0]["state_sha256"] == runs[1]["state_sha256"] != ref["state_sha256"]
    assert runs[0]["tokens_sha256"] == ref["tokens_sha256"]
    assert runs[0]["local_params"] > ref["local_params"]  # a decoder layer and two MTP projections per block


def test_bf16_precision_is_deterministic_schedule_free_and_keeps_an_fp32_model(local_repro, tmp_path):
    ref_root, ref = local_repro
    over = {"local.precision": "bf16", "local.mtp": "first"}
    runs = [_train(_copy(ref_root, tmp_path / s, {**over, "local.schedule": s})) for s in ("phased", "early_backward")]
    again = _train(_copy(ref_root, tmp_path / "again", {**over, "local.schedule": "phased"}))
    assert runs[0]["state_sha256"] == runs[1]["state_sha256"] == again["state_sha256"]
    fp32 = _train(_copy(ref_root, tmp_path / "fp32", {"local.mtp": "first"}))
    assert fp32["state_sha256"] != runs[0]["state_sha256"]  # bf16 autocast changes the arithmetic
    assert fp32["tokens_sha256"] == runs[0]["tokens_sha256"] == ref["tokens_sha256"]
    w = _weights(tmp_path / "phased")
    assert w and all(t.dtype == torch.float32 for t in w.values())
    assert abs(runs[0]["heldout_ce"] - fp32["heldout_ce"]) < 0.05  # same recipe, bf16 rounding only


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_boundary_is_what_forward_passes_on(local_repro, tmp_path, precision):
    """LocalBlock.boundary (the sequential mode's stored outputs) equals forward's output bit for bit."""
    from zgtrain.local.simultaneous import build

    root = _copy(local_repro[0], tmp_path / precision, {"local.precision": precision})
    run = build(project_of(root), Layout(root))
    x = batch = run.ids[:3]
    with torch.no_grad():
        for blk in run.blocks:
            h = blk(x, batch)[0]
            assert h.dtype == torch.float32 and torch.equal(blk.boundary(x), h)
            x = h


def test_k1_arm_runs_as_a_dvc_experiment_and_sees_the_same_tokens(local_repro, tmp_path):
    ref_root, ref = local_repro
    root = tmp_path / "proj"
    shutil.copytree(ref_root, root, symlinks=True)
    res = run(["dvc", "exp", "run", "-S", "partition.boundaries=[0,4]"], cwd=root)
    # the partition is the local stage's alone: the teacher (tokenizer only) and the token set stay
    assert "Running stage 'local'" in res.stdout
    assert "Running stage 'teacher'" not in res.stdout and "Running stage 'tokens'" not in res.stdout
    r = read_json(root / "metrics" / "local.json")
    assert r["k"] == 1 and r["local_params"] == 0  # end to end: the model's own head, no auxiliary one
    assert r["tokens_sha256"] == ref["tokens_sha256"] and _batches(root)[0] == _batches(ref_root)[0]
    assert _batches(ref_root)[0] == _batches(ref_root)[1]  # every block of an arm trains on every batch
    assert r["state_sha256"] != ref["state_sha256"]


def test_partition_that_does_not_cut_the_model_is_one_line(local_repro, tmp_path):
    root = _copy(local_repro[0], tmp_path / "proj", {"partition.boundaries": [0, 2, 3]})
    before = tree_sha256(root)
    assert_user_error(zg_main("train", "local", cwd=root, check=False), "partition.boundaries", "local.layers=4")
    assert tree_sha256(root) == before


def test_resume_of_another_run_is_refused_unless_restart(local_repro, tmp_path):
    root = _copy(local_repro[0], tmp_path / "proj")
    _train(root, stop_after=2)
    set_params(root, {"local.lr": 0.002})
    with pytest.raises(ZgError, match="another run .*lr"):
        _train(root)
    assert _train(root, restart=True)["status"] == "done"


def test_a_checkpoint_name_that_leaves_the_run_folder_is_refused(local_repro, tmp_path):
    """run/meta.json's checkpoint is read back as a path: a '..' out of models/local/run is refused in one line."""
    root = _copy(local_repro[0], tmp_path / "proj")
    _train(root, stop_after=2)
    meta_path = root / "models" / "local" / "run" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "checkpoint": "../../../.."}))
    res = zg_main("train", "local", cwd=root, check=False)
    assert_user_error(res, "the checkpoint meta.json names,", "outside", "zg train local --restart")


def test_checkpoint_dir_keeps_a_recorded_name_inside_its_run_folder(tmp_path):
    """The one reader of meta.json's checkpoint (block, variant, repair, local simultaneous and sequential)."""
    from zgtrain.fit.checkpoint import checkpoint_dir

    d = tmp_path / "models" / "local" / "blocks" / "b00"
    d.mkdir(parents=True)
    assert checkpoint_dir(d, {"checkpoint": "ckpt-000002"}, fix="x") == d / "ckpt-000002"
    for bad in ("../b01/ckpt-000002", str(tmp_path), "../../../.."):
        with pytest.raises(ZgError, match="outside"):
            checkpoint_dir(d, {"checkpoint": bad}, fix="x")


# --- sequential (dataset-centric) mode ------------------------------------------------------------------


def test_sequential_mode_stages_lineage_and_downstream_only_reruns(local_repro, tmp_path):
    ref_root, ref = local_repro
    root = _copy(ref_root, tmp_path / "proj", {"local.mode": "sequential"})
    assert load_params_of(root)["local"]["blocks"] == {"b00": {}, "b01": {}}  # one params key per block stage
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "sequential"], cwd=root)
    res = run(["dvc", "repro"], cwd=root)
    for stage in ("local_b00", "local_b01", "local_export"):
        assert f"Running stage '{stage}'" in res.stdout, res.stdout
    m = read_json(root / "metrics" / "local.json")
    assert m["mode"] == "sequential" and m["k"] == 2 and 0 < m["heldout_ce"] < 8
    # block 0 trains alone from the same init on the same batches: bitwise the simultaneous run's block 0
    assert m["block_state_sha256"]["b00"] == ref["block_state_sha256"]["b00"]
    assert m["block_state_sha256"]["b01"] != ref["block_state_sha256"]["b01"]
    assert m["tokens_sha256"] == ref["tokens_sha256"]
    # block 1 trained from block 0's outputs, whose lineage is block 0's state
    import lance

    from zgdata.store.lance_io import schema_meta

    h02 = schema_meta(lance.dataset(str(root / "data" / "local" / "h02.lance")).schema)
    assert h02["block"] == "b00" and h02["state_sha256"] == m["block_state_sha256"]["b00"] and h02["layer"] == 2
    assert read_json(root / "metrics" / "local" / "b01.json")["input_fingerprint"] == h02["fingerprint"]
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "dvc repro"], cwd=root)
    # editing block 1 reruns block 1 and the export only
    set_params(root, {"local.blocks.b01": {"lr": 0.002}})
    res = run(["dvc", "repro"], cwd=root)
    assert "Running stage 'local_b01'" in res.stdout and "Running stage 'local_export'" in res.stdout
    assert "Running stage 'local_b00'" not in res.stdout
    m2 = read_json(root / "metrics" / "local.json")
    assert m2["block_state_sha256"]["b00"] == m["block_state_sha256"]["b00"]
    assert m2["block_state_sha256"]["b01"] != m["block_state_sha256"]["b01"]


def test_local_block_params_are_checked(tmp_path):
    params = profile_params("local-tiny")
    params["local"]["blocks"] = {"b01": {"steps": 3}}
    with pytest.raises(ZgError, match="local.blocks.b01.steps is set but local.mode is simultaneous"):
        project_of(params)
    params["local"].update(mode="sequential", blocks={"b01": {"lr": -1}})
    with pytest.raises(ZgError) as e:
        project_of(params)
    assert e.value.key == "local.blocks.b01.lr"
    params["local"]["blocks"] = {"b01": {"aux": "mlp"}}
    with pytest.raises(ZgError, match="override only steps, lr"):
        project_of(params)


def test_a_sequential_block_before_its_upstream_names_the_stage_to_run(local_repro, tmp_path):
    """`zg train local-block b01` before b00 wrote its boundary: one line naming local_b00 (a local project has no
    materialize stage to point at)."""
    root = _copy(local_repro[0], tmp_path / "proj", {"local.mode": "sequential"})
    line = assert_user_error(zg_main("train", "local-block", "b01", cwd=root, check=False), "block b00 writes it")
    assert "`dvc repro local_b00`" in line and "materialize" not in line, line


@pytest.mark.parametrize("depth", [2, 3])
def test_the_mtp_term_predicts_t_plus_2_to_mtp_depth_as_defined(depth):
    """local.mtp_depth D: a block's MTP term is the mean, over d = 2..D, of the CE of token t+d from position t
    through norm(z + proj_d(z)) and the block's head (recomputed here from that definition); under `first` only
    block 0 has it. One offset short (D = 2 training no MTP at all) passed the schedule tests, which compare runs."""
    import torch.nn.functional as F

    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.local.model import make_blocks
    from zgtrain.project.local import LocalConfig

    model = tiny_teacher("llama")[0].eval()
    vocab = model.config.vocab_size
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    blocks = make_blocks(model, [0, 2, 4], LocalConfig(mtp="all", mtp_depth=depth), gens)
    assert [b.mtp_offsets for b in blocks] == [list(range(2, depth + 1))] * 2
    first = make_blocks(model, [0, 2, 4], LocalConfig(mtp="first", mtp_depth=depth), gens)
    assert [b.mtp_offsets for b in first] == [list(range(2, depth + 1)), []]

    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    last = blocks[1]
    x = blocks[0].boundary(ids)
    with torch.no_grad():
        _, _, terms = last(x, ids)
        z = last.boundary(x)  # the last block's z is its output
        want = torch.stack(
            [
                F.cross_entropy(last.lm_head(last.norm(z + proj(z)))[:, :-d].reshape(-1, vocab), ids[:, d:].reshape(-1))
                for proj, d in zip(last.mtp, range(2, depth + 1))
            ]
        ).mean()
    assert torch.allclose(terms["mtp"], want, rtol=1e-5, atol=1e-6), (terms["mtp"], want)

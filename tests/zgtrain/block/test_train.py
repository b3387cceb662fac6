"""Block trainer: bitwise guarantees 1 and 2, resume refusal, conversions, objectives, guard rails.

Everything runs on the real tiny project (random:tiny teacher, real Lance boundaries). Bitwise claims
compare ``state_sha256`` strings (weights + optimizer state); the reference is one straight
`zg train block b00` run with the tiny profile's params (12 steps, checkpoint every 4) and the
``noisy_regress`` objective, so that a resume must also restore the block's noise generator.
The bitwise, resume and NaN checks go through the real `zg` CLI in subprocesses; set-up steps and
errors raised before any write are exercised in-process with the same functions the CLI calls.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import lance
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import (
    copy_project,
    load_params_of,
    loss_curve,
    project_of,
    read_json,
    set_params,
    tree_sha256,
)
from tests.helpers.runners import kill_after_first_checkpoint, zg_main
from zgdata.core.metrics_file import read_timings
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.lineage import LINEAGE_KEYS
from zgdata.store.lance_io import schema_meta
from zgtrain.block.load import load_block
from zgtrain.block.train import train_block
from zgtrain.fit import checkpoint
from zgtrain.fit.checkpoint import state_sha256
from zgtrain.fit.schedule import block_seed


def _train_json(root, *args, env=None) -> dict:
    return json.loads(zg_main("train", "block", "b00", "--json", *args, cwd=root, env=env).stdout)


def _block_files(root) -> set[str]:
    return {p.name for p in (root / "models" / "blocks" / "b00").iterdir()}


def _reference_params(root) -> dict:
    return set_params(root, {"train.objective": "noisy_regress"})


def _init_stamp(root) -> tuple[int, int]:
    st = (root / "models" / "blocks" / "b00" / "init.safetensors").stat()
    return st.st_ino, st.st_mtime_ns


@pytest.fixture(scope="module")
def straight(tiny_built, tmp_path_factory):
    """One uninterrupted cached run of b00 with the profile's params: (project, `--json` result)."""
    root = copy_project(tiny_built, tmp_path_factory.mktemp("straight") / "proj")
    _reference_params(root)
    res = _train_json(root)
    assert res["status"] == "done" and res["step"] == res["steps"] == 12 and res["targets"] == "cached"
    return root, res


# --- guarantee 1: cached and online targets -------------------------------------------------------------


def test_cached_and_online_targets_are_bitwise_identical(straight, tiny_project):
    _, ref = straight
    _reference_params(tiny_project)
    # Without stored boundaries the online run can only get its pairs from the teacher.
    shutil.rmtree(tiny_project / "data" / "boundaries")
    online = _train_json(tiny_project, "--targets", "online", "--restart")
    assert online["targets"] == "online" and online["status"] == "done"
    assert online["state_sha256"] == ref["state_sha256"]
    assert online["heldout_loss"] == ref["heldout_loss"]
    assert (tiny_project / "plots" / "loss" / "b00.csv").read_text() == (
        straight[0] / "plots" / "loss" / "b00.csv"
    ).read_text()


def test_online_targets_run_the_teacher_in_materialize_batches(tiny_project, monkeypatch):
    """Online targets capture in forwards of materialize.batch_size rows, a short last one padded (a GPU's kernels
    are chosen per shape: the same row count as materialize keeps the bits); the rows equal the stored ones."""
    import zgdata.families.capture as cap
    from zgtrain.block.targets import open_targets

    project = project_of(tiny_project)
    spec, layout, mcfg = project.block("b01").spec, Layout(tiny_project), project.materialize
    online = open_targets("online", layout, spec, project.partition, mcfg)
    cached = open_targets("cached", layout, spec, project.partition, mcfg)
    shapes, real = [], cap.capture
    monkeypatch.setattr(
        cap, "capture", lambda model, ids, *a, **k: shapes.append(tuple(ids.shape)) or real(model, ids, *a, **k)
    )
    rows = cached.rows("train")[: mcfg.batch_size + 1]
    got = online.take(rows)
    assert [s[0] for s in shapes] == [mcfg.batch_size, mcfg.batch_size], shapes
    for a, b in zip(got, cached.take(rows), strict=True):
        assert torch.equal(a, b)


# --- guarantee 2: interrupt and resume -------------------------------------------------------------------


def test_stop_after_then_resume_is_bitwise_identical(straight, tiny_project):
    _, ref = straight
    _reference_params(tiny_project)
    # stop in this process, resume in a fresh `zg` process
    stopped = train_block(project_of(tiny_project), "b00", stop_after=5, layout=Layout(tiny_project))
    assert stopped.status == "stopped" and stopped.step == 5
    meta = read_json(tiny_project / "models" / "blocks" / "b00" / "meta.json")
    assert meta["step"] == 5 and meta["done"] is False and meta["checkpoint"] == "ckpt-000005"
    assert _block_files(tiny_project) == {"init.safetensors", "meta.json", "ckpt-000005"}
    stamp = _init_stamp(tiny_project)

    resumed = _train_json(tiny_project)
    assert resumed["status"] == "done" and resumed["step"] == 12
    assert resumed["state_sha256"] == ref["state_sha256"]
    assert _init_stamp(tiny_project) == stamp  # it resumed: a restart would have rewritten init.safetensors
    assert [s for s, _ in loss_curve(tiny_project)] == list(range(12))
    assert loss_curve(tiny_project) == loss_curve(straight[0])


def test_kill_9_between_checkpoints_then_resume_is_bitwise_identical(straight, tiny_project):
    _, ref = straight
    _reference_params(tiny_project)
    meta_path = tiny_project / "models" / "blocks" / "b00" / "meta.json"
    assert not meta_path.exists()
    kill_after_first_checkpoint(
        ["train", "block", "b00"], tiny_project, meta_path, tiny_project.parent / "killed.stderr"
    )
    meta = read_json(meta_path)
    assert meta["done"] is False and 0 < meta["step"] < 12
    assert (meta_path.parent / meta["checkpoint"] / "model.safetensors").exists()
    assert not (meta_path.parent / "model.safetensors").exists()
    stamp = _init_stamp(tiny_project)

    resumed = _train_json(tiny_project)
    assert resumed["status"] == "done"
    assert resumed["state_sha256"] == ref["state_sha256"]
    assert _init_stamp(tiny_project) == stamp
    assert loss_curve(tiny_project) == loss_curve(straight[0])
    # nothing half-written from the killed run is left in the DVC output
    assert _block_files(tiny_project) == {"init.safetensors", "meta.json", "model.safetensors", "ckpt-000012"}


def test_resume_with_changed_config_is_refused_unless_restart(tiny_project):
    layout = Layout(tiny_project)
    first = train_block(project_of(tiny_project), "b00", stop_after=2, layout=layout)
    assert first.status == "stopped" and first.step == 2
    before = tree_sha256(tiny_project / "models" / "blocks" / "b00")

    old_lr = load_params_of(tiny_project)["train"]["lr"]
    set_params(tiny_project, {"train.lr": old_lr / 4})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "--restart", "lr")
    assert f"lr: {old_lr} -> {old_lr / 4}" in line  # the diff names the old and the new value
    assert tree_sha256(tiny_project / "models" / "blocks" / "b00") == before  # checkpoint untouched

    # through the CLI, so that --restart is checked to reach train_block's restart
    again = _train_json(tiny_project, "--restart", "--stop-after", "1")
    assert again["status"] == "stopped" and again["step"] == 1
    meta = read_json(tiny_project / "models" / "blocks" / "b00" / "meta.json")
    assert meta["config"]["lr"] == old_lr / 4 and meta["step"] == 1


# --- conversions --------------------------------------------------------------------------------------


def test_identity_conversion_reproduces_the_teacher_boundary(tiny_project):
    set_params(tiny_project, {"train.conversion": "identity", "train.steps": 0})
    layout = Layout(tiny_project)
    m = train_block(project_of(tiny_project), "b00", layout=layout)
    assert m.status == "done" and m.steps == 0 and m.conversion == "identity"
    # only bf16 storage rounding of h00 and h02 separates the block's output from the stored h02
    assert 0 <= m.heldout_loss < 1e-3
    assert m.params == m.teacher_params
    block, _ = load_block(layout, "b00")
    slice_ = load_file(str(layout.teacher_slice("b00")))
    weights = block.weights()
    assert len(weights) == len(slice_)
    for k, v in weights.items():
        _, j, rest = k.split(".", 2)
        teacher_idx = int(j)  # b00 covers teacher layers 0 and 1
        assert torch.equal(v, slice_[f"layers.{teacher_idx}.{rest}"].float()), k


def _expected_pruned(root, teacher_params: int, ratio: float) -> int:
    arch = read_json(root / "models" / "teacher" / "teacher.json")["architecture"]
    hidden, inter = arch["hidden_size"], arch["intermediate_size"]
    layers = 2  # b00: h00 -> h02
    keep = max(1, round(inter * (1 - ratio)))
    return teacher_params - layers * 3 * hidden * (inter - keep)  # gate, up (I x H) and down (H x I)


def test_prune_mlp_cuts_params_by_its_ratio(straight, tiny_project):
    root, ref = straight
    m = read_json(root / "metrics" / "blocks" / "b00.json")
    assert m["conversion"] == "prune_mlp" and load_params_of(root)["train"]["prune_ratio"] == 0.5
    assert m["params"] == _expected_pruned(root, m["teacher_params"], 0.5)
    assert m["param_ratio"] == m["params"] / m["teacher_params"]
    assert read_json(root / "models" / "blocks" / "b00" / "meta.json")["intermediate_sizes"] == [64, 64]
    # another ratio, untrained
    set_params(tiny_project, {"train.prune_ratio": 0.75, "train.steps": 0})
    m2 = train_block(project_of(tiny_project), "b00", layout=Layout(tiny_project))
    assert m2.teacher_params == m["teacher_params"]
    assert m2.params == _expected_pruned(tiny_project, m2.teacher_params, 0.75)


# --- objectives ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["regress", "noisy_regress", "denoise"])
def test_each_objective_lowers_its_own_loss(tiny_project, objective):
    set_params(
        tiny_project,
        {
            "train.objective": objective,
            "train.steps": 30,
            "train.lr": 1.0e-3,
            "train.warmup": 3,
            "train.checkpoint_every": 0,
        },
    )
    m = train_block(project_of(tiny_project), "b00", layout=Layout(tiny_project))
    assert m.objective == objective and m.steps == 30
    curve = loss_curve(tiny_project)
    assert [s for s, _ in curve] == list(range(30))
    losses = [v for _, v in curve]
    assert all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.9 * first, (objective, losses)
    assert m.train_loss < m.first_loss


# --- guard rails --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", LINEAGE_KEYS)
def test_boundary_pair_with_mismatched_lineage_is_refused(tiny_project, key):
    """Each lineage key of the pair is compared: one changed in the target boundary alone is refused, naming it."""
    path = tiny_project / "data" / "boundaries" / "h02.lance"
    ds = lance.dataset(str(path))
    lineage = dict(schema_meta(ds.schema)["lineage"])
    original = str(lineage[key])
    lineage[key] = "deadbeef" * 8
    ds.update_schema_metadata({"zg.lineage": json.dumps(lineage, sort_keys=True)})
    assert schema_meta(lance.dataset(str(path)).schema)["lineage"][key] == "deadbeef" * 8

    with pytest.raises(ZgError) as err:
        train_block(project_of(tiny_project), "b00", layout=Layout(tiny_project))
    for needle in (key, "h00", "h02", original[:16], "deadbeefdeadbeef"):
        assert needle in str(err.value), (needle, str(err.value))
    assert not (tiny_project / "models" / "blocks" / "b00").exists()


def test_block_pair_outside_the_partition_is_refused(tiny_project):
    params = set_params(tiny_project, {"blocks.b00.out": "h04"})
    with pytest.raises(ZgError) as err:
        train_block(project_of(params), "b00", layout=Layout(tiny_project))
    assert err.value.key == "blocks.b00"
    for needle in ("blocks.b00", "h00 -> h04", "b00: h00->h02"):
        assert needle in str(err.value), (needle, str(err.value))
    assert not (tiny_project / "models" / "blocks" / "b00").exists()


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tiny_project):
    set_params(tiny_project, {"train.lr": 1.0e6, "train.checkpoint_every": 1, "train.grad_clip": 0})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "blocks.b00", "loss became", "--restart")
    assert "nan" in line or "inf" in line
    d = tiny_project / "models" / "blocks" / "b00"
    meta = read_json(d / "meta.json")
    assert meta["done"] is False and meta["step"] < meta["steps"] == 12
    assert f"(step {meta['step']}) is intact" in line
    assert not (d / "model.safetensors").exists()
    assert not (tiny_project / "metrics" / "blocks" / "b00.json").exists()
    weights = load_file(str(d / meta["checkpoint"] / "model.safetensors"))
    assert weights and all(torch.isfinite(v).all() for v in weights.values())
    block, _ = load_block(Layout(tiny_project), "b00", which="init")
    missing, unexpected = block.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.startswith("rotary_emb.") for k in missing)


def test_a_run_broken_by_its_last_step_is_not_recorded_as_done(tiny_project):
    """The last optimizer step leaves weights that give a non-finite held-out loss (lr 1e30): one line naming the
    block's key, and the run is not recorded as done (it was, with a NaN heldout_loss in its metrics)."""
    set_params(tiny_project, {"train.lr": 1.0e30, "train.warmup": 0, "train.steps": 1, "train.checkpoint_every": 0})
    line = assert_user_error(zg_main("train", "block", "b00", cwd=tiny_project, check=False), "blocks.b00", "--restart")
    assert "held-out loss became" in line or "non-finite" in line, line
    d = tiny_project / "models" / "blocks" / "b00"
    meta = read_json(d / "meta.json")
    assert meta["done"] is False and not (tiny_project / "metrics" / "blocks" / "b00.json").exists()
    weights = load_file(str(d / meta["checkpoint"] / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_absurd_learning_rate_is_a_clear_error_not_a_traceback(tiny_project):
    # At lr 1e38 AdamW's Python-float step size overflows before any tensor turns non-finite.
    set_params(tiny_project, {"train.lr": 1.0e38, "train.checkpoint_every": 1, "train.grad_clip": 0})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    line = assert_user_error(res, "blocks.b00", "lower train.lr", "--restart")
    d = tiny_project / "models" / "blocks" / "b00"
    meta = read_json(d / "meta.json")
    assert meta["done"] is False and f"(step {meta['step']}) is intact" in line
    assert not (d / "model.safetensors").exists()
    assert not (tiny_project / "metrics" / "blocks" / "b00.json").exists()
    weights = load_file(str(d / meta["checkpoint"] / "model.safetensors"))
    assert weights and all(torch.isfinite(v).all() for v in weights.values())


@pytest.mark.parametrize("key,value", [("train.lr", float("inf")), ("train.lr", 0.0), ("train.beta2", 1.0)])
def test_optimizer_params_out_of_range_are_refused_before_training(tiny_project, key, value):
    set_params(tiny_project, {key: value})
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, key)
    assert not (tiny_project / "models" / "blocks" / "b00").exists()


# --- outputs ------------------------------------------------------------------------------------------


def test_metrics_curve_and_block_directory(straight):
    root, ref = straight
    m = read_json(root / "metrics" / "blocks" / "b00.json")
    for k in (
        "steps",
        "train_loss",
        "heldout_loss",
        "params",
        "teacher_params",
        "objective",
        "conversion",
        "state_sha256",
    ):
        assert k in m and m[k] is not None, k
    assert m == {k: ref[k] for k in m}
    assert "tokens_per_s" not in m and read_timings(root / "metrics" / "blocks" / "b00.json")["tokens_per_s"] > 0
    assert m["steps"] == 12 and m["objective"] == "noisy_regress" and m["conversion"] == "prune_mlp"
    assert len(m["state_sha256"]) == 64

    curve = loss_curve(root)
    assert [s for s, _ in curve] == list(range(12))
    assert curve[0][1] == pytest.approx(m["first_loss"], rel=1e-5)  # the csv keeps 6 significant digits

    d = root / "models" / "blocks" / "b00"
    assert _block_files(root) == {"init.safetensors", "meta.json", "model.safetensors", "ckpt-000012"}
    meta = read_json(d / "meta.json")
    assert meta["done"] is True and meta["step"] == 12 and meta["state_sha256"] == m["state_sha256"]
    for name in ("h00", "h02"):
        ds = lance.dataset(str(root / "data" / "boundaries" / f"{name}.lance"))
        assert meta["fingerprints"][name] == schema_meta(ds.schema)["fingerprint"]
    assert set(meta["fingerprints"]) == {"h00", "h02"}
    assert meta["teacher_sha256"] == read_json(root / "models" / "teacher" / "teacher.json")["weights_sha256"]

    # the recorded state hash describes the saved files: final weights + the last checkpoint's optimizer
    block, _ = load_block(Layout(root), "b00")
    ckpt = d / "ckpt-000012"
    assert all(torch.equal(v, load_file(str(ckpt / "model.safetensors"))[k]) for k, v in block.weights().items())
    opt = torch.optim.AdamW(block.parameters())
    checkpoint.restore(d, meta, block, opt, torch.Generator())  # weights, optimizer and RNG of ckpt-000012
    assert state_sha256(block, opt) == m["state_sha256"]
    init, _ = load_block(Layout(root), "b00", which="init")
    assert any(not torch.equal(v, init.weights()[k]) for k, v in block.weights().items())


def test_block_seed_is_stable_and_keyed():
    assert block_seed(0, 0, "b00") == 273867478539702659
    seeds = {block_seed(0, 0, "b00"), block_seed(0, 0, "b01"), block_seed(1, 0, "b00"), block_seed(0, 1, "b00")}
    assert len(seeds) == 4


def test_each_block_trains_under_its_own_seed(reproduced):
    """A block's seed is a stable hash of the global seed, train.seed and its key (zgtrain/fit/schedule.py
    ``block_seed``): two blocks of one project train under different seeds, each the one its meta.json records."""
    from zgtrain.fit.schedule import block_seed

    project = project_of(reproduced)
    seeds = {}
    for key in project.blocks:
        meta = json.loads((reproduced / "models" / "blocks" / key / "meta.json").read_text())
        seeds[key] = meta["seed"]
        assert meta["seed"] == block_seed(project.seed, project.block(key).train.seed, key), key
    assert len(seeds) >= 2 and len(set(seeds.values())) == len(seeds), seeds
    assert block_seed(0, 0, "b00") != block_seed(1, 0, "b00") != block_seed(1, 1, "b00")
    assert block_seed(0, 0, "b00") == int(hashlib.sha256(b"0/0/b00").hexdigest()[:15], 16)  # no process state

"""Materialize: bitwise determinism, capture semantics, a real kill -9 and resume, and clear refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest
import torch
import yaml

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.datasets import boundary_bits, journal_rows, set_schema_meta
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import kill_9_when, zg_main
from zgdata.config import CorpusConfig, MaterializeConfig, PartitionConfig, TeacherConfig, section
from zgdata.errors import ZgError
from zgdata.inspect import collect
from zgdata.layout import Layout
from zgdata.materialize.driver import estimate_bytes, materialize
from zgdata.store.lance_io import open_dataset
from zgdata.store.reader import BoundaryDataset, BoundaryPair
from zgdata.teacher.prepare import load_teacher, prepare, tiny_teacher
from zgdata.tokens.store import read_tokens
from zgdata.tokens.tokenset import tokenize


def _configs(root):
    params = yaml.safe_load((root / "params.yaml").read_text())
    return section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")


def _assert_same_boundaries(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name]["fingerprint"] == want[name]["fingerprint"], name
        assert torch.equal(got[name]["seq_id"], want[name]["seq_id"]), name
        assert got[name]["bits"].dtype == torch.int16, name
        assert torch.equal(got[name]["bits"], want[name]["bits"]), name


def test_rematerialize_is_bitwise_identical(tiny_built, tiny_project):
    want = boundary_bits(tiny_built)  # written by `zg data materialize` in another process
    shutil.rmtree(tiny_project / "data" / "boundaries")
    cfg, part = _configs(tiny_project)
    r = materialize(cfg, part, layout=Layout(tiny_project))
    assert not r.skipped and r.resumed_from == 0
    got = boundary_bits(tiny_project)
    _assert_same_boundaries(got, want)
    assert r.fingerprints == {n: v["fingerprint"] for n, v in want.items()}
    # unchanged lineage: a second run writes nothing
    before = tree_sha256(tiny_project / "data" / "boundaries")
    assert materialize(cfg, part, layout=Layout(tiny_project)).skipped
    assert tree_sha256(tiny_project / "data" / "boundaries") == before


def test_boundaries_are_transformers_hidden_states(tiny_built):
    layout = Layout(tiny_built)
    cfg, part = _configs(tiny_built)
    teacher = read_json(layout.teacher_json)
    depth = teacher["architecture"]["num_layers"]
    assert part.boundaries[-1] == depth  # the last boundary is the last layer's output
    model, _ = load_teacher(layout, dtype=cfg.compute_dtype, with_tokenizer=False)
    pre_norm = []
    hook = model.model.norm.register_forward_pre_hook(lambda mod, args: pre_norm.append(args[0].detach().clone()))
    stored = {n: BoundaryDataset(layout.boundary(n)) for n in part.names}
    n_rows = len(stored[part.names[0]].seq_ids)
    try:
        for lo in range(0, n_rows, cfg.batch_size):  # the batches materialize ran
            rows = np.arange(lo, min(lo + cfg.batch_size, n_rows))
            ids, _ = read_tokens(layout, rows)
            pre_norm.clear()
            with torch.no_grad():
                hs = model(ids, output_hidden_states=True).hidden_states
            assert len(pre_norm) == 1 and len(hs) == depth + 1
            for name, layer in zip(part.names, part.boundaries):
                x = stored[name].take(rows)
                assert x.dtype == torch.bfloat16
                ref = pre_norm[0] if layer == depth else hs[layer]
                assert torch.equal(x.view(torch.int16), ref.to(torch.bfloat16).view(torch.int16)), (name, lo)
            # transformers' last hidden state is after the final norm: not what the last boundary stores
            assert not torch.equal(stored[part.names[-1]].take(rows), hs[depth].to(torch.bfloat16))
    finally:
        hook.remove()


def _ahead_of_journal(root) -> list[str]:
    """Staged boundaries that hold an append the journal has not recorded (a commit cut in half)."""
    import lance

    out = []
    for j in (root / "data" / ".staging").glob("*/journal.json"):
        try:
            versions = json.loads(j.read_text())["versions"]
        except (OSError, ValueError, KeyError):
            continue
        for path in j.parent.glob("*.lance"):
            try:
                if lance.dataset(str(path)).version > versions.get(path.stem, 0):
                    out.append(path.stem)
            except Exception:  # being created right now
                continue
    return out


@pytest.mark.long
@pytest.mark.parametrize("failpoint", ["ZG_FAILPOINT_SLEEP_AFTER_COMMIT", "ZG_FAILPOINT_SLEEP_MID_COMMIT"])
def test_kill_9_then_resume_is_bitwise_identical(tiny_built, tiny_project, failpoint):
    """Killed after a journaled commit, or half-way through one (some boundaries appended, the journal
    not yet updated: the resume must roll those back)."""
    root = tiny_project
    want = boundary_bits(tiny_built)  # an uninterrupted run (commit_rows 16)
    n_rows = len(want["h00"]["seq_id"])
    edit_params(root, materialize={"commit_rows": 8})
    shutil.rmtree(root / "data" / "boundaries")
    mid = failpoint.endswith("MID_COMMIT")
    proc = kill_9_when(
        lambda: journal_rows(root) > 0 and (not mid or bool(_ahead_of_journal(root))),
        ["data", "materialize"],
        root,
        {**os.environ, failpoint: "1.0"},
        root.parent / "killed.stderr",
        "the first journaled commit",
    )
    assert proc.returncode == -signal.SIGKILL, "materialize finished before it was killed"
    done = journal_rows(root)
    assert 0 < done < n_rows
    if failpoint.endswith("MID_COMMIT"):
        assert _ahead_of_journal(root), "the kill did not land inside a commit"

    # nothing that looks complete: data/boundaries has no dataset, the staged ones are marked half-written
    boundaries = root / "data" / "boundaries"
    assert not boundaries.exists() or not any(boundaries.iterdir()), sorted(boundaries.iterdir())
    (stage,) = [p.parent for p in (root / "data" / ".staging").glob("*/journal.json")]
    staged = sorted(stage.glob("*.lance"))
    assert staged, "the killed run left no staged dataset"
    for path in staged:
        with pytest.raises(ZgError, match="half-written"):
            open_dataset(path, kind="boundary")

    res = zg_main("data", "materialize", "--json", cwd=root)
    out = json.loads(res.stdout)
    assert out["resumed_from"] == done and not out["skipped"]
    _assert_same_boundaries(boundary_bits(root), want)
    assert not any(stage.parent.iterdir()), "staging was not cleaned up"


def test_kill_9_between_publishes_finishes_the_capture_instead_of_redoing_it(tiny_built, tiny_project):
    """Killed after the first boundary was renamed into place and before the others: the rerun, whose plan now
    holds only the missing boundaries, publishes them from the killed run's finished capture (it used to drop
    that staging folder, keyed by the whole plan, and run the teacher over every row again). The boundaries are
    bitwise an uninterrupted run's; the published one keeps its files."""
    root = tiny_project
    want = boundary_bits(tiny_built)
    boundaries = root / "data" / "boundaries"
    shutil.rmtree(boundaries)
    published = lambda: sorted(p.name for p in boundaries.glob("*.lance")) if boundaries.exists() else []  # noqa: E731
    proc = kill_9_when(
        lambda: bool(published()),
        ["data", "materialize"],
        root,
        {**os.environ, "ZG_FAILPOINT_SLEEP_AFTER_PUBLISH": "600"},
        root.parent / "killed.stderr",
        "the first published boundary",
    )
    assert proc.returncode == -signal.SIGKILL
    first = published()
    assert first == ["h00.lance"], first
    kept = tree_sha256(boundaries / "h00.lance")

    res = zg_main("data", "materialize", "--json", cwd=root)
    out = json.loads(res.stdout)
    assert out["resumed_from"] == len(want["h00"]["seq_id"]) and not out["skipped"], out  # no row captured again
    assert published() == ["h00.lance", "h02.lance", "h04.lance"]
    assert tree_sha256(boundaries / "h00.lance") == kept
    _assert_same_boundaries(boundary_bits(root), want)
    assert not any((root / "data" / ".staging").iterdir()), "staging was not cleaned up"


def test_float16_storage_is_refused(tiny_project):
    edit_params(tiny_project, materialize={"storage_dtype": "float16"})
    before = tree_sha256(tiny_project / "data" / "boundaries")
    res = zg_main("data", "materialize", cwd=tiny_project, check=False)
    assert_user_error_alone(res, "materialize.storage_dtype", "float16", "25,000")
    assert tree_sha256(tiny_project / "data" / "boundaries") == before


def test_partition_deeper_than_teacher(tiny_project):
    edit_params(tiny_project, partition={"boundaries": [0, 2, 6]})
    shutil.rmtree(tiny_project / "data" / "boundaries")
    res = zg_main("data", "materialize", cwd=tiny_project, check=False)
    assert_user_error_alone(res, "partition.boundaries", "6", "4 layers")
    assert not (tiny_project / "data" / "boundaries").exists()


def test_tokens_from_another_tokenizer_are_refused(tiny_project, tmp_path):
    # A second teacher: same kind of tiny model, but its tokenizer lowercases (a different tokenizer_sha256).
    from tokenizers import normalizers

    model, tok = tiny_teacher()
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()
    src = tmp_path / "lowercase-teacher"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    other = Layout(tmp_path / "other")
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    prep = prepare(TeacherConfig(source=str(src)), section(params, PartitionConfig, "partition"), layout=other)
    ours = read_json(tiny_project / "models" / "teacher" / "teacher.json")
    assert prep.tokenizer_sha256 != ours["tokenizer_sha256"]
    tokenize(section(params, CorpusConfig, "corpus"), layout=other)

    # the other project's token set is copied into ours
    shutil.rmtree(tiny_project / "data" / "tokens.lance")
    shutil.copytree(other.tokens, tiny_project / "data" / "tokens.lance")
    shutil.copy(other.tokens_json, tiny_project / "data" / "tokens.json")
    shutil.rmtree(tiny_project / "data" / "boundaries")
    res = zg_main("data", "materialize", cwd=tiny_project, check=False)
    assert_user_error_alone(
        res, "tokenizer", prep.tokenizer_sha256[:12], ours["tokenizer_sha256"][:12], "dvc repro tokens"
    )
    assert not (tiny_project / "data" / "boundaries").exists()


def _delete_data_files(path):
    files = sorted((path / "data").glob("*.lance"))
    assert files
    for f in files:
        f.unlink()


def _truncate_manifests(path):
    manifests = sorted((path / "_versions").glob("*.manifest"))
    assert manifests
    for m in manifests:
        data = m.read_bytes()
        m.write_bytes(data[: len(data) // 2])


def _mark_incomplete(path):
    set_schema_meta(path, complete=False)


@pytest.mark.parametrize(
    "damage",
    [_delete_data_files, _truncate_manifests, _mark_incomplete],
    ids=["data-files-deleted", "manifest-truncated", "half-written"],
)
def test_damaged_boundary_dataset(tiny_project, damage):
    layout = Layout(tiny_project)
    bad, others = layout.boundary("h02"), [layout.boundary("h00"), layout.boundary("h04")]
    before = {p.name: tree_sha256(p) for p in others}
    damage(bad)

    res = zg_main("data", "verify", "--lineage-only", cwd=tiny_project, check=False)
    line = assert_user_error_alone(res, "h02.lance", "dvc checkout", "materialize")
    assert "h00" not in line and "h04" not in line

    for pair in ((others[0], bad), (bad, others[1])):
        with pytest.raises(ZgError, match="dvc checkout"):
            BoundaryPair(*pair)
    if damage is _mark_incomplete:  # inspect still shows what it is
        (info,) = collect([bad])
        assert info["complete"] is False and info["name"] == "h02"
    else:
        with pytest.raises(ZgError, match="dvc checkout"):
            collect([bad])

    # the other datasets are untouched and still open
    assert {p.name: tree_sha256(p) for p in others} == before
    pair = BoundaryPair(*others)
    assert len(pair.rows("train")) > 0


def test_not_enough_disk(tiny_project, monkeypatch):
    import zgdata.materialize.driver as mat

    root = tiny_project
    shutil.rmtree(root / "data" / "boundaries")
    cfg, part = _configs(root)
    tokens = read_json(root / "data" / "tokens.json")
    hidden = read_json(root / "models" / "teacher" / "teacher.json")["architecture"]["hidden_size"]
    need = estimate_bytes(
        sum(tokens["rows"].values()), tokens["lineage"]["seq_len"], hidden, cfg.storage_dtype, len(part.boundaries)
    )
    free = need // 3
    monkeypatch.setattr(mat.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 9 * need, free))
    with pytest.raises(ZgError) as e:
        materialize(cfg, part, layout=Layout(root))
    msg = str(e.value)
    assert "not enough free disk" in msg
    assert f"{need / 1e9:.2g} GB" in msg and f"{free / 1e9:.2g} GB is free" in msg, msg
    assert not (root / "data" / "boundaries").exists()
    assert not any((root / "data" / ".staging").rglob("*.lance"))


def _disk_bytes(*roots) -> int:
    """Allocated bytes of every file under ``roots``, each inode once (finalize hard-links)."""
    seen, total = set(), 0
    for root in roots:
        for p in root.rglob("*"):
            st = p.lstat()
            if p.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def test_the_free_space_estimate_covers_what_a_real_run_holds_at_its_peak(tiny_project, monkeypatch):
    """Right after finalize (the peak: staged fragments, their compacted copy, the published datasets) the
    staging dir and data/boundaries hold no more than estimate_bytes, and not much less."""
    import zgdata.materialize.driver as mat

    root = tiny_project
    shutil.rmtree(root / "data" / "boundaries")
    cfg, part = _configs(root)
    peak = {}
    real_finalize = mat.finalize

    def finalize(stage, names, *a, **kw):
        out = real_finalize(stage, names, *a, **kw)
        peak["bytes"] = _disk_bytes(stage, root / "data" / "boundaries")
        peak["names"] = names
        return out

    monkeypatch.setattr(mat, "finalize", finalize)
    materialize(cfg, part, layout=Layout(root))
    tokens = read_json(root / "data" / "tokens.json")
    hidden = read_json(root / "models" / "teacher" / "teacher.json")["architecture"]["hidden_size"]
    need = estimate_bytes(
        sum(tokens["rows"].values()), tokens["lineage"]["seq_len"], hidden, cfg.storage_dtype, len(peak["names"])
    )
    assert peak["bytes"] <= need <= 4 * peak["bytes"], (peak, need)


def test_an_edited_teacher_config_with_the_same_weights_is_materialized_again(tmp_path, monkeypatch):
    """Same weights, another config.json (rms_norm_eps): the fingerprint (weights, tokenizer, tokens, layer, ...) is
    the same, but the boundaries are not. A direct `zg data materialize` after re-preparing must capture them again
    (it said "up to date" and kept the old config's), and verify's teacher recompute then agrees with them."""
    from zgdata.config import VerifyConfig
    from zgdata.verify import verify

    model, tok = tiny_teacher("llama")
    src = tmp_path / "src"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    root = tmp_path / "proj"
    (root / "texts").mkdir(parents=True)
    monkeypatch.chdir(root)
    for i in range(6):
        (root / "texts" / f"d{i}.txt").write_text(f"Document {i} talks about rivers, mills and old roads. " * 20)
    layout, part, mcfg = Layout(root), PartitionConfig(boundaries=[0, 2, 4]), MaterializeConfig()
    corpus = CorpusConfig(source=["texts/*.txt"], heldout=["d5"], seq_len=32)
    prepare(TeacherConfig(source=str(src)), part, layout=layout)
    tokenize(corpus, layout=layout)
    first = materialize(mcfg, part, layout=layout)
    before = BoundaryDataset(layout.boundary("h02")).take([0])
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.5}))
    prepare(TeacherConfig(source=str(src)), part, layout=layout)
    again = materialize(mcfg, part, layout=layout)
    assert again.fingerprints == first.fingerprints and not again.skipped
    assert not torch.equal(BoundaryDataset(layout.boundary("h02")).take([0]), before)
    report = verify(VerifyConfig(), layout=layout, partition=part, mcfg=mcfg)
    assert report.status == "ok", report.summary
    assert materialize(mcfg, part, layout=layout).skipped  # and now it is up to date


def test_the_staging_folder_is_keyed_by_the_codec():
    """The staging key names the codec: a zstd run killed midway must not be resumed by a raw run (or the reverse),
    whose staged rows would be stored in the other codec under the same fingerprints."""
    from zgdata.materialize.driver import _Plan, _stage_dir

    plan = _Plan({}, {}, ["h02"], [2], {}, {"h02": "f" * 64}, 4, 8, 8)
    raw = _stage_dir(plan, MaterializeConfig(codec="raw"), Layout(), "xxh3_128")
    zstd = _stage_dir(plan, MaterializeConfig(codec="zstd"), Layout(), "xxh3_128")
    assert raw.parent == zstd.parent == Layout().staging
    assert raw != zstd


def test_a_changed_lossless_codec_rewrites_the_boundaries(tiny_project):
    """A lossless codec keeps the fingerprint, so only the stored codec tells the raw boundaries of the tiny project
    from what materialize.codec zstd asks for: materialize rewrites them in zstd instead of calling them up to date."""
    layout = Layout(tiny_project)
    assert BoundaryDataset(layout.boundary("h02")).codec == "raw"
    fp = BoundaryDataset(layout.boundary("h02")).fingerprint
    edit_params(tiny_project, materialize={"codec": "zstd"})
    res = zg_main("data", "materialize", "--json", cwd=tiny_project)
    out = json.loads(res.stdout)
    assert out["skipped"] is False
    for name in ("h00", "h02", "h04"):
        assert BoundaryDataset(layout.boundary(name)).codec == "zstd", name
    assert BoundaryDataset(layout.boundary("h02")).fingerprint == fp  # lossless: the same boundary, other bytes

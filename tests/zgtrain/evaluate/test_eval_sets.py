"""Several evaluation sets, intervals, gates per set and the generation check.

The pipeline's own evaluate (tiny profile: the in-domain split plus the embedded `docs` set) is read
from the session's ``reproduced`` project; one more real `zg train evaluate` runs in a copy with two
user sets (a JSONL file and a glob of text files) and gates on two sets. Config errors are checked
pure (ProjectConfig) and once through the CLI, with nothing written.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, read_json, set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.tokens.tokenset import corpus_digest
from zgtrain.pipeline.profiles import profile_params
from zgtrain.pipeline.stages import dvc_yaml
from zgtrain.project.config import ProjectConfig

PER_SET = (
    "teacher_ce",
    "student_ce",
    "untrained_ce",
    "ce_gap",
    "ce_gap_ci95",
    "ce_recovered",
    "teacher_context_use",
    "student_context_use",
    "untrained_context_use",
    "context_retention",
    "context_retention_ci95",
    "top1_agreement",
    "sequences",
    "ce_tokens",
    "context_targets",
    "lineage",
)
NEWS = [
    {
        "id": f"n{i}",
        "text": f"Item {i}: the city council met on Tuesday to discuss the new budget for roads, "
        f"schools and the public library. Members voted {i + 3} to {9 - i} in favour.",
    }
    for i in range(6)
]
NOTES = {
    "a.txt": "Remember to water the plants, call the plumber about the kitchen sink, and renew the car "
    "insurance before the end of the month. " * 2,
    "b.txt": "The meeting moved to Thursday at ten. Bring the quarterly report and the slides about the "
    "new onboarding process for engineers. " * 2,
}


def _check_set(f: dict, seq_len: int) -> None:
    for k in PER_SET:
        assert k in f, k
    assert f["ce_gap"] == f["student_ce"] - f["teacher_ce"]  # from exactly the reported numbers
    assert f["context_retention"] == f["student_context_use"] / f["teacher_context_use"]
    assert f["ce_recovered"] == (f["untrained_ce"] - f["student_ce"]) / (f["untrained_ce"] - f["teacher_ce"])
    # every real token but each row's first is predicted and scored (a padded last row counts its real tokens)
    assert f["sequences"] == f["lineage"]["rows"] and f["lineage"]["tokens"] <= f["sequences"] * seq_len
    assert f["ce_tokens"] == f["lineage"]["tokens"] - f["sequences"]
    assert 0 <= f["top1_agreement"] <= 1
    for key, point in (("ce_gap_ci95", f["ce_gap"]), ("context_retention_ci95", f["context_retention"])):
        lo, hi = f[key]["lo"], f[key]["hi"]
        assert lo <= point <= hi, (key, lo, point, hi)


def test_pipeline_reports_every_set(reproduced):
    m = read_json(reproduced / "metrics" / "eval.json")
    assert set(m["sets"]) == {"heldout", "docs"}
    held, docs = m["sets"]["heldout"], m["sets"]["docs"]
    for f in (held, docs):
        _check_set(f, 64)
    for k in ("teacher_ce", "student_ce", "ce_gap", "ce_gap_ci95", "context_retention", "top1_agreement"):
        assert m[k] == held[k], k  # the top-level figures are the in-domain set's, as before sets existed
    assert m["heldout_tokens"] == held["lineage"]["tokens"] and m["context_targets"] == held["context_targets"]
    lin = docs["lineage"]
    assert lin["source"] == "embedded:docs" and lin["documents"] == 4  # two READMEs, two licenses
    assert lin["rows"] == 16 < lin["rows_packed"]  # the tiny profile's max_seqs: 16
    assert len(lin["corpus_digest"]) == 64 and lin["tokenizer_sha256"]
    rows = (reproduced / "plots" / "eval" / "sets.csv").read_text().splitlines()  # params order: heldout first
    assert rows[0].startswith("set,ce_tokens,") and [r.split(",")[0] for r in rows[1:]] == ["heldout", "docs"]
    report = (reproduced / "reports" / "generation.md").read_text()
    assert report.count("## Prompt ") == 3 and report.count("| prompt | teacher | student |") == 3
    assert m["generation"]["prompts"] == 3 and 0 <= m["generation"]["matching_prefix_mean"] <= 16


def test_user_sets_gates_per_set_and_determinism(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    (root / "ood").mkdir()
    (root / "ood" / "news.jsonl").write_text("".join(json.dumps(r) + "\n" for r in NEWS))
    for name, text in NOTES.items():
        (root / "ood" / name).write_text(text)
    first = read_json(reproduced / "metrics" / "eval.json")
    params = set_params(
        root,
        {
            "eval.sets": [
                {"name": "news", "source": "ood/news.jsonl", "max_seqs": 4, "context_targets": 16},
                {"name": "notes", "source": ["ood/*.txt"], "format": "text"},  # a list, as the docs write it
            ],
            "gates.sets": ["heldout", "news"],
            "gates.max_ce_gap": -100,
            "gates.min_context_retention": -1e9,
        },
    )
    res = zg_main("train", "evaluate", cwd=root)
    m = read_json(root / "metrics" / "eval.json")
    assert set(m["sets"]) == {"heldout", "news", "notes"}
    for f in m["sets"].values():
        _check_set(f, 64)
    # lineage: the digest of exactly these documents, and the byte-level tokenizer's token counts
    news = m["sets"]["news"]["lineage"]
    assert news["corpus_digest"] == corpus_digest((r["id"], r["text"]) for r in NEWS)
    total = sum(len(r["text"]) + 1 for r in NEWS)  # one token a byte, plus EOS after each document
    assert news["tokens_total"] == total and news["rows_packed"] == -(-total // 64) and news["rows"] == 4
    notes = m["sets"]["notes"]["lineage"]
    assert notes["corpus_digest"] == corpus_digest((n.removesuffix(".txt"), t) for n, t in sorted(NOTES.items()))
    total = sum(len(t) + 1 for t in NOTES.values())
    assert total % 64 > 1  # the tail is a padded last row: every token is used
    assert notes["tokens"] == notes["tokens_total"] == total and notes["rows"] == notes["rows_packed"] == -(
        -total // 64
    )
    assert m["sets"]["notes"]["ce_tokens"] == total - notes["rows"]
    assert m["sets"]["news"]["context_targets"] == 16 and m["sets"]["notes"]["context_targets"] == 64  # eval.*
    # the same inputs in another process give the same figures and intervals, bit for bit
    assert m["sets"]["heldout"] == first["sets"]["heldout"]
    # gates per set: every gate of every set is listed; only gates.sets decide
    g = m["gates_passed"]
    assert set(g) == {"all", "heldout", "news", "notes"}
    assert {n for n in g if n != "all" and g[n]["judged"]} == {"heldout", "news"}
    for name in ("heldout", "news", "notes"):
        assert g[name]["max_ce_gap"]["passed"] is False and g[name]["min_context_retention"]["passed"] is True
        assert g[name]["max_ce_gap"]["value"] == m["sets"][name]["ce_gap"]
    assert g["all"] is False
    assert "failed on eval set 'heldout'" in res.stderr and "failed on eval set 'news'" in res.stderr
    assert "failed on eval set 'notes'" not in res.stderr
    # DVC watches the literal file, not the glob
    deps = dvc_yaml(ProjectConfig.from_params(params), code_deps=False)["stages"]["evaluate"]["deps"]
    assert "ood/news.jsonl" in deps and not any("*" in d for d in deps)


@pytest.mark.parametrize(
    "sets,gates,key",
    [
        (["docs"], None, "eval.sets[0]"),
        ([{"name": "x"}], None, "eval.sets[0].source"),
        ([{"source": "a.txt"}], None, "eval.sets[0].name"),
        ([{"name": "x", "source": "a.txt", "bogus": 1}], None, "eval.sets[0]"),
        ([{"name": "Bad Name", "source": "a.txt"}], None, "eval.sets[0].name"),
        ([{"name": "heldout", "source": "a.txt"}], None, "eval.sets[0].name"),
        ([{"name": "x", "source": "a.txt"}, {"name": "x", "source": "b.txt"}], None, "eval.sets[1].name"),
        ([{"name": "x", "source": "a.txt", "format": "csv"}], None, "eval.sets[0].format"),
        ([{"name": "x", "source": "a.txt", "max_seqs": -1}], None, "eval.sets[0].max_seqs"),
        ([{"name": "x", "source": "a.txt", "context_targets": "many"}], None, "eval.sets[0].context_targets"),
        ([{"name": "x", "source": 5}], None, "eval.sets[0].source"),
        ([{"name": "x", "source": "embedded:poems"}], None, "eval.sets[0].source"),
        ([], ["docs"], "gates.sets"),
        ([], [], "gates.sets"),
    ],
)
def test_bad_set_config_names_its_key(sets, gates, key):
    """Refused when params are read (before any stage writes; the CLI's one-line rendering of such errors is
    tests/zgtrain/project/test_params_validation.py's)."""
    params = profile_params("tiny")
    params["eval"]["sets"] = sets
    if gates is not None:
        params["gates"]["sets"] = gates
    with pytest.raises(ZgError) as e:
        ProjectConfig.from_params(params)
    assert e.value.key == key, e.value
    assert key.split(".")[0] in e.value.render() and "\n" not in e.value.render()


def _published(root) -> tuple:
    """What evaluate writes: its metrics, report and plots."""
    return tuple(tree_sha256(root / d) for d in ("metrics", "reports", "plots"))


def test_bad_sets_are_one_line_and_write_nothing(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    before = _published(root)
    (root / "ood.jsonl").write_text('{"body": "no text field here"}\n')
    for sets, needles in (
        ([{"name": "gone", "source": "missing/*.md"}], ["eval.sets[0].source", "'gone'"]),
        ([{"name": "bad", "source": "ood.jsonl"}], ["eval.sets[0].text_field", "ood.jsonl line 1"]),
    ):
        set_params(root, {"eval.sets": sets})  # valid params: refused when the set is read
        assert_user_error(zg_main("train", "evaluate", cwd=root, check=False), *needles)
    assert _published(root) == before

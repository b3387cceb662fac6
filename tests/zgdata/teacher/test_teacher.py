"""Teacher preparation: reproducible ids, clear errors for bad sources, the real embedded SmolLM2."""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.config import PartitionConfig, TeacherConfig
from zgdata.core.hashing import tensors_sha256
from zgdata.layout import Layout
from zgdata.teacher.prepare import load_teacher, prepare

TINY_PARTITION = PartitionConfig(boundaries=[0, 2, 4])


def _file_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_random_tiny_is_reproducible(tiny_built, tmp_path):
    a = prepare(TeacherConfig(source="random:tiny"), TINY_PARTITION, layout=Layout(tmp_path / "a"))
    b = prepare(TeacherConfig(source="random:tiny"), TINY_PARTITION, layout=Layout(tmp_path / "b"))
    cli = read_json(tiny_built / "models" / "teacher" / "teacher.json")  # prepared by `zg` in another process
    assert len(a.weights_sha256) == 64
    assert a.weights_sha256 == b.weights_sha256 == cli["weights_sha256"]
    assert a.tokenizer_sha256 == b.tokenizer_sha256 == cli["tokenizer_sha256"]
    assert read_json(a.path / "teacher.json") == read_json(b.path / "teacher.json")
    # the files themselves, not only the recorded digests
    for rel in ("hf/model.safetensors", "blocks/b00.safetensors", "blocks/b01.safetensors", "blocks/head.safetensors"):
        assert (
            _file_sha(a.path / rel) == _file_sha(b.path / rel) == _file_sha(tiny_built / "models" / "teacher" / rel)
        ), rel
    # the recorded digest describes what was saved
    model, _ = load_teacher(Layout(tmp_path / "a"), with_tokenizer=False)
    assert tensors_sha256(model.state_dict()) == a.weights_sha256


@pytest.mark.parametrize("case", ["random:huge", "foo:bar", "missing-path", "empty-dir"])
def test_bad_teacher_source(tiny_project, tmp_path, case):
    if case == "missing-path":
        source, needle = str(tmp_path / "no-such-model"), "does not exist"
    elif case == "empty-dir":
        (tmp_path / "empty").mkdir()
        source, needle = str(tmp_path / "empty"), "not a transformers model"
    else:
        source, needle = case, "unknown teacher alias"
    edit_params(tiny_project, teacher={"source": source})
    before = tree_sha256(tiny_project / "models" / "teacher")
    res = zg_main("teacher", "prepare", cwd=tiny_project, check=False)
    assert_user_error_alone(res, "teacher.source", needle)
    assert tree_sha256(tiny_project / "models" / "teacher") == before  # the prepared teacher is untouched


ENGLISH = (
    "Every morning, the small bakery on the corner of our street opens its doors at six o'clock. "
    "The owner, a cheerful woman named Maria, has been baking bread there for more than twenty years. "
    "She says that the secret to good bread is patience: the dough needs time to rise, and you cannot rush it. "
    "People from all over the neighborhood come to buy her fresh loaves, croissants and cinnamon rolls. "
    "On weekends, there is often a long line outside, but nobody seems to mind waiting. "
    "Children press their faces against the window to watch the cakes being decorated, while their parents "
    "chat with neighbors and drink coffee. For many families, a visit to the bakery has become a small ritual "
    "that marks the start of the day."
)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The embedded SmolLM2-135M GGUF, prepared once for this module (~0.5 GB written)."""
    layout = Layout(tmp_path_factory.mktemp("smollm2") / "proj")
    result = prepare(TeacherConfig(source="smollm2-135m"), PartitionConfig(), layout=layout)
    return layout, result


@pytest.mark.slow
def test_smollm2_architecture(smollm2):
    layout, result = smollm2
    meta = read_json(layout.teacher_json)
    arch = meta["architecture"]
    assert arch["model_type"] == "llama"
    assert (
        arch["num_layers"],
        arch["hidden_size"],
        arch["num_heads"],
        arch["num_kv_heads"],
        arch["intermediate_size"],
        arch["vocab_size"],
    ) == (30, 576, 9, 3, 1536, 49152)
    assert meta["source"] == "smollm2-135m"
    assert meta["weights_sha256"] == result.weights_sha256 and len(result.weights_sha256) == 64
    assert 130e6 < meta["params"] < 140e6
    # one weight slice per block of the default partition, plus the head
    assert sorted(p.name for p in (layout.teacher_dir / "blocks").iterdir()) == [
        f"b{i:02d}.safetensors" for i in range(6)
    ] + ["head.safetensors"]


@pytest.mark.slow
def test_smollm2_cross_entropy_on_english(smollm2):
    layout, _ = smollm2
    model, tok = load_teacher(layout)
    ids = tok(ENGLISH, return_tensors="pt")["input_ids"]
    assert ids.shape[1] >= 100, ids.shape
    with torch.no_grad():
        logits = model(ids).logits
    ce = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:]).item()
    print(f"SmolLM2 CE on {ids.shape[1]} tokens of plain English: {ce:.3f} nats/token")
    assert ce < 5.0, f"SmolLM2 CE on plain English is {ce:.3f} nats/token"

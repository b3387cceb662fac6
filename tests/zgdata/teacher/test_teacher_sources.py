"""Teacher sources: sharded safetensors directories (index + shards), the stored dtype, incomplete checkpoints.

Every source is a tiny random model built from its family's config and saved with save_pretrained; the sharded
saves use max_shard_size="200KB", which writes model.safetensors.index.json and several shards.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.helpers.assertions import assert_user_error_alone
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.config import PartitionConfig, TeacherConfig
from zgdata.core.hashing import tensors_sha256
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.teacher.prepare import load_slice, load_teacher, load_teacher_checked, prepare, tiny_teacher
from zgdata.teacher.source import INDEX

TINY_PARTITION = PartitionConfig(boundaries=[0, 2, 4])


def _save(model, tok, path, **kw):
    model.save_pretrained(path, **kw)
    tok.save_pretrained(path)
    return path


def _sharded(model, tok, path, size="200KB"):
    _save(model, tok, path, max_shard_size=size)
    shards = sorted(p.name for p in path.glob("model-*.safetensors"))
    assert (path / INDEX).exists() and not (path / "model.safetensors").exists() and len(shards) >= 3, shards
    return shards


def _weight_map(path) -> dict[str, str]:
    return json.loads((path / INDEX).read_text())["weight_map"]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_sharded_dir_prepares_the_same_teacher_as_one_file(tmp_path, model_type):
    model, tok = tiny_teacher(model_type)
    single = _save(model, tok, tmp_path / "single")
    shards = _sharded(model, tok, tmp_path / "sharded")
    a = prepare(TeacherConfig(source=str(single)), TINY_PARTITION, layout=Layout(tmp_path / "a"))
    b = prepare(TeacherConfig(source=str(tmp_path / "sharded")), TINY_PARTITION, layout=Layout(tmp_path / "b"))
    assert a.weights_sha256 == b.weights_sha256 == tensors_sha256(model.state_dict())
    ja, jb = read_json(a.path / "teacher.json"), read_json(b.path / "teacher.json")
    for key in ("weights_sha256", "tokenizer_sha256", "architecture", "params", "dtype", "files"):
        assert ja[key] == jb[key], key
    # bitwise: the prepared weights and every block slice, not only the recorded digests
    assert tree_sha256(a.path / "hf") == tree_sha256(b.path / "hf")
    assert tree_sha256(a.path / "blocks") == tree_sha256(b.path / "blocks")
    # the sharded source is recorded file by file: config, index and every shard
    assert sorted(jb["source_files"]) == sorted(["config.json", INDEX, *shards])
    assert all(jb["source_files"][s] == _sha(tmp_path / "sharded" / s) for s in shards)
    assert sorted(ja["source_files"]) == ["config.json", "model.safetensors"]


def test_sharded_dir_end_to_end(tiny_project, tmp_path):
    """`zg teacher prepare` from a sharded save of the tiny project's own teacher (random:tiny) prepares the same
    teacher, bit for bit: weights, tokenizer digest, hf/model.safetensors and every block slice; each slice holds
    the source's tensors as the index places them."""
    from safetensors import safe_open

    model, tok = tiny_teacher("llama")  # what random:tiny builds
    src = tmp_path / "sharded"
    _sharded(model, tok, src)
    teacher = tiny_project / "models" / "teacher"
    before = read_json(teacher / "teacher.json")
    weights, blocks = _sha(teacher / "hf" / "model.safetensors"), tree_sha256(teacher / "blocks")
    edit_params(tiny_project, teacher={"source": str(src)})
    zg_main("teacher", "prepare", cwd=tiny_project)
    after = read_json(teacher / "teacher.json")
    for key in ("weights_sha256", "tokenizer_sha256", "architecture", "params", "dtype"):
        assert after[key] == before[key], key
    assert after["source"] == str(src) and INDEX in after["source_files"]
    assert _sha(teacher / "hf" / "model.safetensors") == weights and tree_sha256(teacher / "blocks") == blocks
    tensors, meta = load_slice(Layout(tiny_project).teacher_slice("b01"))
    want = {k: shard for k, shard in _weight_map(src).items() if k.startswith(("model.layers.2.", "model.layers.3."))}
    assert meta["layers"] == [2, 3] and sorted(tensors) == sorted(k.removeprefix("model.") for k in want)
    for key, shard in want.items():  # read per key, shard by shard, as the index says
        with safe_open(str(src / shard), framework="pt") as f:
            assert torch.equal(tensors[key.removeprefix("model.")], f.get_tensor(key)), key


def test_bf16_checkpoint_keeps_its_stored_dtype(tmp_path):
    """teacher.dtype auto keeps a bf16 checkpoint bf16; bfloat16 over an fp32 checkpoint casts at load to the same
    bits as casting after; computing in float32 loads exactly the bf16 values."""
    model, tok = tiny_teacher("qwen2")
    _sharded(model, tok, tmp_path / "fp32")
    stored = tiny_teacher("qwen2")[0].to(torch.bfloat16)
    _sharded(stored, tok, tmp_path / "bf16", size="100KB")
    layout = Layout(tmp_path / "auto")
    auto = prepare(TeacherConfig(source=str(tmp_path / "bf16"), dtype="auto"), TINY_PARTITION, layout=layout)
    assert read_json(layout.teacher_json)["dtype"] == "bfloat16"
    assert auto.weights_sha256 == tensors_sha256(stored.state_dict())
    tensors, _ = load_slice(layout.teacher_slice("b00"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    cast = prepare(
        TeacherConfig(source=str(tmp_path / "fp32"), dtype="bfloat16"), TINY_PARTITION, layout=Layout(tmp_path / "cast")
    )
    assert cast.weights_sha256 == auto.weights_sha256
    _, _, check = load_teacher_checked(layout, dtype="bfloat16", with_tokenizer=False, rehash=True)
    assert check["weights_sha256_checked"] is True
    wide, _ = load_teacher(layout, dtype="float32", with_tokenizer=False)
    want = stored.state_dict()
    for k, v in wide.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, want[k].float()), k


def test_large_teacher_is_prepared_in_shards_and_each_is_checked(tmp_path, monkeypatch):
    """A teacher over HF_SHARD_SIZE is saved as shards + index: teacher.json records every one, it loads to
    weights_sha256, and a missing or swapped shard is refused before anything loads."""
    import zgdata.teacher.prepare as teacher

    monkeypatch.setattr(teacher, "HF_SHARD_SIZE", "200KB")  # what a multi-GB teacher gets at the default size
    layout = Layout(tmp_path / "proj")
    prep = prepare(TeacherConfig(source="random:tiny-qwen2"), TINY_PARTITION, layout=layout)
    shards = sorted(p.name for p in layout.teacher_hf.glob("model-*.safetensors"))
    files = read_json(layout.teacher_json)["files"]
    assert len(shards) >= 3 and INDEX in files and all(files[s] == _sha(layout.teacher_hf / s) for s in shards)
    _, _, check = load_teacher_checked(layout, dtype="float32", with_tokenizer=False, rehash=True)
    assert check["weights_sha256_checked"] is True and check["files"] == len(files)
    assert tree_sha256(layout.teacher_dir / "blocks") == tree_sha256(
        prepare(TeacherConfig(source="random:tiny-qwen2"), TINY_PARTITION, layout=Layout(tmp_path / "one")).path
        / "blocks"
    )  # the slices do not depend on how hf/ is cut
    assert prep.weights_sha256 == read_json(tmp_path / "one" / "models" / "teacher" / "teacher.json")["weights_sha256"]
    (layout.teacher_hf / shards[1]).rename(tmp_path / "aside")
    with pytest.raises(ZgError, match=f"{shards[1]} is missing .teacher.json lists it"):
        load_teacher(layout, with_tokenizer=False)
    (tmp_path / "aside").rename(layout.teacher_hf / shards[1])
    (layout.teacher_hf / shards[1]).write_bytes((layout.teacher_hf / shards[2]).read_bytes())
    with pytest.raises(ZgError, match=f"{shards[1]} does not match teacher.json"):
        load_teacher(layout, with_tokenizer=False)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_bf16_teacher_computes_in_fp32_one_layer_at_a_time(tmp_path, model_type):
    """Loaded for capture, a bf16 teacher stays bf16 and capture widens one layer at a time: the boundaries equal
    those of a whole fp32 load, bit for bit, and no tensor stays widened."""
    from zgdata.families.capture import capture
    from zgdata.families.widen import compute_dtype

    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source=f"random:tiny-{model_type}", dtype="bfloat16"), TINY_PARTITION, layout=layout)
    whole, _ = load_teacher(layout, dtype="float32", with_tokenizer=False)
    lazy, _, check = load_teacher_checked(layout, dtype="float32", with_tokenizer=False, rehash=True, per_layer=True)
    assert compute_dtype(lazy) == torch.float32 and compute_dtype(whole) is None
    assert check["weights_sha256_checked"] is True  # loaded as stored, so verify checks the tensors too
    stored = {k: v.clone() for k, v in lazy.state_dict().items()}
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0))
    for storage in (torch.float32, torch.bfloat16):
        a = capture(whole, ids, [0, 2, 4], storage_dtype=storage)
        b = capture(lazy, ids, [0, 2, 4], storage_dtype=storage)
        assert all(torch.equal(a[k], b[k]) for k in (0, 2, 4)), storage
    after = lazy.state_dict()
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(after[k], v) for k, v in stored.items())
    narrow, _ = load_teacher(layout, dtype="bfloat16", with_tokenizer=False, per_layer=True)  # computes in bf16
    assert compute_dtype(narrow) is None
    assert not torch.equal(capture(narrow, ids, [4], storage_dtype=torch.float32)[4], a[4])


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_bf16_teacher_runs_whole_in_fp32_one_piece_at_a_time(tmp_path, model_type):
    """What evaluate and lm-eval do with a bf16 teacher: loaded per_layer and run whole under running_widened, its
    logits and greedy continuations equal a whole fp32 load's bit for bit; while a decoder layer runs it is the
    only wide one, and afterwards every tensor is its stored bf16 self again."""
    from zgdata.families.registry import family_of
    from zgdata.families.widen import running_widened
    from zgtrain.evaluate.generation import greedy

    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source=f"random:tiny-{model_type}", dtype="bfloat16"), TINY_PARTITION, layout=layout)
    whole, _ = load_teacher(layout, dtype="float32", with_tokenizer=False)
    lazy, _ = load_teacher(layout, dtype="float32", with_tokenizer=False, per_layer=True)
    stored = {k: v.clone() for k, v in lazy.state_dict().items()}
    layers = family_of(lazy.config).layers(lazy)
    wide_while_running = []

    def count_wide(module, args, output):
        wide_while_running.append([next(m.parameters()).dtype for m in layers].count(torch.float32))

    hooks = [m.register_forward_hook(count_wide) for m in layers]  # registered first: runs before the restore
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), running_widened(lazy):
        logits = lazy(input_ids=ids).logits
        continued = greedy(lazy, ids[:, :8], 6)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        assert torch.equal(logits, whole(input_ids=ids).logits)
        assert torch.equal(continued, greedy(whole, ids[:, :8], 6))
    assert logits.dtype == torch.float32 and wide_while_running and set(wide_while_running) == {1}
    after = lazy.state_dict()
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(after[k], v) for k, v in stored.items())
    with torch.no_grad(), running_widened(whole):  # a model loaded in its compute dtype runs as it is
        assert torch.equal(whole(input_ids=ids).logits, logits)


def test_bf16_teacher_materializes_fp32_bits_and_verifies(tiny_project):
    """Through the CLI: teacher.dtype bfloat16, compute float32 (the default). materialize and verify load it per
    layer; the stored boundaries equal a capture by the whole teacher loaded in fp32, and verify also checks the
    loaded tensors against weights_sha256 (they load in the prepared dtype)."""
    import shutil

    import numpy as np

    from tests.helpers.datasets import boundary_bits
    from zgdata.families.capture import capture
    from zgdata.tokens.store import read_tokens

    edit_params(tiny_project, teacher={"dtype": "bfloat16"})
    zg_main("teacher", "prepare", cwd=tiny_project)
    shutil.rmtree(tiny_project / "data" / "boundaries")
    zg_main("data", "materialize", cwd=tiny_project)
    zg_main("data", "verify", cwd=tiny_project)
    report = read_json(tiny_project / "reports" / "verify.json")
    assert report["status"] == "ok" and report["teacher_files"]["weights_sha256_checked"] is True, report["summary"]
    layout = Layout(tiny_project)
    whole, _ = load_teacher(layout, dtype="float32", with_tokenizer=False)
    stored = boundary_bits(tiny_project)
    rows = np.arange(4)
    ids, _ = read_tokens(layout, rows)
    layers = {name: int(name[1:]) for name in stored}
    fresh = capture(whole, ids, sorted(layers.values()), storage_dtype=torch.bfloat16)
    for name, layer in layers.items():
        assert torch.equal(stored[name]["bits"][rows], fresh[layer].view(torch.int16)), name


def _break(src, shard: str, case: str) -> tuple[str, ...]:
    """Damage one shard of the checkpoint at ``src`` as ``case`` says; the needles its error line must hold."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if case == "missing-shard":
        (src / shard).unlink()
        return str(src / shard), "is missing", INDEX
    if case == "shard-lacks-tensor":
        with safe_open(str(src / shard), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        gone = sorted(tensors)[0]
        del tensors[gone]
        save_file(tensors, str(src / shard), metadata={"format": "pt"})
        return str(src / shard), f"lacks tensor '{gone}'", INDEX
    data = (src / shard).read_bytes()
    (src / shard).write_bytes(data[: len(data) // 2])
    return str(src / shard), "not a readable safetensors file"


def test_missing_shard_is_refused_by_the_cli(tiny_project, tmp_path):
    model, tok = tiny_teacher("llama")
    src = tmp_path / "sharded"
    needles = _break(src, _sharded(model, tok, src)[1], "missing-shard")
    edit_params(tiny_project, teacher={"source": str(src)})
    before = tree_sha256(tiny_project / "models" / "teacher")
    res = zg_main("teacher", "prepare", cwd=tiny_project, check=False)
    line = assert_user_error_alone(res, "teacher.source", *needles)
    assert "copy the complete checkpoint" in line, line
    assert tree_sha256(tiny_project / "models" / "teacher") == before  # the prepared teacher is untouched


@pytest.mark.parametrize("case", ["shard-lacks-tensor", "truncated-shard"])
def test_damaged_shard_is_refused(tmp_path, case):
    model, tok = tiny_teacher("qwen2")
    src = tmp_path / "sharded"
    needles = _break(src, _sharded(model, tok, src)[1], case)
    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source="random:tiny-qwen2"), TINY_PARTITION, layout=layout)
    before = tree_sha256(layout.teacher_dir)
    with pytest.raises(ZgError) as e:
        prepare(TeacherConfig(source=str(src)), TINY_PARTITION, layout=layout)
    line = str(e.value)
    assert "\n" not in line and e.value.key == "teacher.source" and "copy the complete checkpoint" in line, line
    assert all(n in line for n in needles), (needles, line)
    assert tree_sha256(layout.teacher_dir) == before


def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path):
    """The index's shards are plain file names in the checkpoint's own folder: one that names a path out of it
    (``../other/...``) is refused in one line before any file is read, even where that file exists and holds the
    tensor."""
    from safetensors.torch import save_file

    from zgdata.teacher.source import weight_files

    shard = "model-00001-of-00001.safetensors"
    (tmp_path / "other").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other" / shard), metadata={"format": "pt"})
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {"w": f"../other/{shard}"}}))
    with pytest.raises(ZgError) as e:
        weight_files(src)
    line = str(e.value)
    assert "\n" not in line and e.value.key == "teacher.source", line
    assert f"maps tensors to '../other/{shard}', which is not a file name in {src}" in line, line


def test_single_file_missing_a_tensor_is_refused(tmp_path):
    """Without an index the check is transformers' own report of missing weights (it would initialize them)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model, tok = tiny_teacher("gpt2")
    src = _save(model, tok, tmp_path / "single")
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    gone = next(k for k in sorted(tensors) if ".h.1.mlp.c_fc" in k)
    del tensors[gone]
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source="random:tiny-gpt2"), TINY_PARTITION, layout=layout)
    before = tree_sha256(layout.teacher_dir)
    with pytest.raises(ZgError, match=r"lack '.*h\.1\.mlp\.c_fc.*'.*config\.json") as e:
        prepare(TeacherConfig(source=str(src)), TINY_PARTITION, layout=layout)
    assert "\n" not in str(e.value) and e.value.key == "teacher.source"
    assert tree_sha256(layout.teacher_dir) == before


def test_a_prepare_that_fails_at_the_tokenizer_leaves_the_prepared_teacher_as_it_was(tmp_path):
    """A source whose tokenizer has no fast backend (so no hash) fails in one line, after its weights were saved:
    the teacher prepared before keeps its models/teacher/hf and teacher.json, byte for byte."""
    from transformers import ByT5Tokenizer

    model, _ = tiny_teacher("llama")
    byt5 = ByT5Tokenizer()
    model.resize_token_embeddings(len(byt5))
    src = _save(model, byt5, tmp_path / "src")
    layout = Layout(tmp_path / "proj")
    prepare(TeacherConfig(source="random:tiny"), TINY_PARTITION, layout=layout)
    before = tree_sha256(layout.teacher_dir)
    with pytest.raises(ZgError, match="fast backend"):
        prepare(TeacherConfig(source=str(src)), TINY_PARTITION, layout=layout)
    assert tree_sha256(layout.teacher_dir) == before
    load_teacher_checked(layout)


def test_a_tokenizer_with_ids_past_the_embeddings_is_refused_at_prepare(tmp_path):
    """A ``<pad>`` added to the tokenizer without resizing the embeddings: prepare refuses it in one line, naming
    the token and its id (before, tokenize accepted its ids and materialize died in torch.embedding), and writes
    nothing."""
    model, tok = tiny_teacher("llama")
    tok.add_special_tokens({"pad_token": "<pad>"})
    assert len(tok) == model.config.vocab_size + 1
    src = _save(model, tok, tmp_path / "src")
    layout = Layout(tmp_path / "proj")
    with pytest.raises(ZgError, match=r"'<pad>' \(257\) have no embedding row") as e:
        prepare(TeacherConfig(source=str(src)), TINY_PARTITION, layout=layout)
    assert e.value.key == "teacher.source"
    assert not layout.teacher_json.exists() and not layout.teacher_hf.exists()

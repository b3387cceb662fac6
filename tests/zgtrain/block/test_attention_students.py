"""The ``kv_heads`` conversion in a real tiny Llama project (4 heads, 2 KV heads): a block trained from its boundary
pair with only ``conversion: kv_heads`` in its params, bit for bit the same twice and with online targets; its
metrics' KV bytes; the assembled student with mixed KV heads (zg's pinned modeling file) and with one count
(the stock config, no remote code); what export does with each. The same for ``attn_linear``. In-process
(``train_block``, ``zg_main``).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.llama_cpp_run import import_llama_cpp
from tests.helpers.projects import b00_converted, b00_weights, copy_project, project_of, read_json, set_params
from tests.helpers.runners import zg_main
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.block.train import train_block

# one cached position of one tiny-Llama layer with 1 KV head: key + value, 16 dims, float32 = 2 * 16 * 4 bytes
PER_HEAD = 2 * 16 * 4


@pytest.fixture(scope="module")
def kv_project(tiny_built, tmp_path_factory):
    """The tiny project with b00 converted to kv_heads (3 steps) and b01 the identity (untrained)."""
    # nothing else: kv_heads defaults to half the teacher's 2
    return b00_converted(tiny_built, tmp_path_factory.mktemp("kv") / "proj", "kv_heads", steps=3)


def test_kv_heads_block_trains_deterministically_cached_and_online(kv_project, tmp_path):
    layout = Layout(kv_project)
    first = train_block(project_of(kv_project), "b00", restart=True, layout=layout).metrics()
    assert first["status"] == "done" and first["conversion"] == "kv_heads"
    meta = read_json(layout.block_dir("b00") / "meta.json")
    assert meta["kv_heads"] == [1, 1] and meta["config"]["kv_heads"] == 0
    w1 = b00_weights(kv_project)
    assert w1["layers.0.self_attn.k_proj.weight"].shape == (16, 64)  # 1 head of 16 dims
    # two grouped layers: 1 head each where the teacher's layers cache 2
    assert first["kv_bytes_per_token"] == 2 * PER_HEAD and first["teacher_kv_bytes_per_token"] == 2 * 2 * PER_HEAD
    assert first["kv_ratio"] == 0.5 and first["param_ratio"] < 1
    assert first["params"] == first["teacher_params"] - 2 * 2 * 16 * 64  # k and v lose one head of 16 x 64

    again = train_block(project_of(kv_project), "b00", restart=True, layout=layout).metrics()
    assert again["state_sha256"] == first["state_sha256"]
    assert all(torch.equal(v, w1[k]) for k, v in b00_weights(kv_project).items())

    online = copy_project(kv_project, tmp_path / "online")
    shutil.rmtree(online / "data" / "boundaries")  # the online run can only get its pairs from the teacher
    res = train_block(project_of(online), "b00", targets="online", restart=True, layout=Layout(online)).metrics()
    assert res["targets"] == "online" and res["state_sha256"] == first["state_sha256"]
    assert res["heldout_loss"] == first["heldout_loss"]
    assert all(torch.equal(v, w1[k]) for k, v in b00_weights(online).items())


def _gguf_ints(path, key: str) -> list[int]:
    from gguf import GGUFReader

    field = GGUFReader(path).fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def _generates(model, vocab: int):
    ids = torch.randint(0, vocab, (1, 10), generator=torch.Generator().manual_seed(5))
    greedy = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    out = model.generate(ids, **greedy, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(model.generate(ids, **greedy, use_cache=False), out.sequences)
    with torch.no_grad():
        full = model(input_ids=out.sequences).logits[0]
    for step, logits in enumerate(out.logits):
        torch.testing.assert_close(logits[0], full[9 + step], rtol=1e-4, atol=1e-4)


def test_kv_heads_students_assemble_load_and_export(kv_project, tmp_path):
    """Mixed (b00 at 1 KV head, b01 the teacher's 2): zg's modeling file; HF export refused in one line with nothing
    written, GGUF as llama.cpp's deci (per-layer head_count_kv). Uniform (both blocks at 1): the stock LlamaConfig,
    loaded without remote code, HF and GGUF (llama) export. Both GGUF files run in llama.cpp like the student."""
    from transformers import AutoModelForCausalLM

    from zgtrain.export.gguf import check_gguf, export_gguf
    from zgtrain.student.assemble import assemble, build_student
    from zgtrain.student.load import load_student

    root = copy_project(kv_project, tmp_path / "proj")
    layout = Layout(root)
    project = project_of(root)
    if not (layout.block_dir("b00") / "model.safetensors").exists():
        train_block(project, "b00", restart=True, layout=layout)
    train_block(project, "b01", restart=True, layout=layout)
    assemble(project, layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    assert summary["layer_kv_heads"] == [1, 1, 2, 2] and summary["remote_code"] is True
    assert summary["kv_bytes_per_token"] == (1 + 1 + 2 + 2) * PER_HEAD  # full attention: heads x per-head bytes
    assert summary["teacher_kv_bytes_per_token"] == 4 * 2 * PER_HEAD
    assert read_json(layout.student / "config.json")["layer_kv_heads"] == [1, 1, 2, 2]
    model = load_student(layout.student)
    assert type(model).__name__ == "ZgLlamaForCausalLM"
    built, _ = build_student(project, layout=layout)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, built(input_ids=ids).logits)
    _generates(model, model.config.vocab_size)
    out = root / "models" / "out-hf"
    res = zg_main("export", "student", "--format", "hf", "--out", str(out), cwd=root, check=False)
    assert_user_error(res, "layer 2 has 2 KV heads where layer 0 has 1", "num_key_value_heads")
    assert not out.exists()
    mixed = tmp_path / "mixed.gguf"
    info = export_gguf(layout.student, mixed, dtype="f32")
    assert info["arch"] == "deci" and _gguf_ints(mixed, "deci.attention.head_count_kv") == [1, 1, 2, 2]
    mixed_student = copy_project(layout.student, tmp_path / "mixed-student")

    set_params(root, {"blocks.b01.conversion": "kv_heads", "blocks.b01.kv_heads": 1})
    train_block(project_of(root), "b01", restart=True, layout=layout)
    assemble(project_of(root), layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    assert summary["layer_kv_heads"] == [1] * 4 and summary["remote_code"] is False
    assert summary["kv_bytes_per_token"] == 4 * PER_HEAD and summary["kv_ratio"] == 0.5
    cfg = read_json(layout.student / "config.json")
    assert cfg["num_key_value_heads"] == 1 and "auto_map" not in cfg and "layer_kv_heads" not in cfg
    assert not list(layout.student.glob("*.py"))
    stock = AutoModelForCausalLM.from_pretrained(layout.student, trust_remote_code=False, dtype=torch.float32).eval()
    assert type(stock).__name__ == "LlamaForCausalLM"
    _generates(stock, stock.config.vocab_size)
    zg_main("export", "student", "--format", "hf", "--out", "models/hf", cwd=root)
    assert read_json(root / "models" / "hf" / "config.json")["num_key_value_heads"] == 1
    info = export_gguf(layout.student, tmp_path / "s.gguf", dtype="f32")
    assert info["arch"] == "llama" and _gguf_ints(tmp_path / "s.gguf", "llama.attention.head_count_kv") == [1]
    for name in ("gemma2", "olmo2"):  # families whose llama.cpp arch has no per-layer counts: refused, nothing written
        summary = {"family": name, "intermediate_sizes": [8, 8], "layer_kv_heads": [1, 2]}
        folder = tmp_path / name
        folder.mkdir()
        (folder / "zerograph.json").write_text(json.dumps(summary))
        (folder / "config.json").write_text("{}")
        with pytest.raises(ZgError, match="layer 1 has 2 KV heads where layer 0 has 1") as e:
            check_gguf(folder)
        assert "\n" not in str(e.value) and "head_count_kv" in str(e.value)

    import_llama_cpp()  # the rest needs llama.cpp (skipped where it is not installed; `make setup` installs it)
    from tests.helpers.llama_cpp_run import assert_close_to_f32, llama_cpp_logits, llama_cpp_model
    from tests.helpers.models import student_logits

    ids = torch.randint(3, 200, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    for gguf_file, folder in ((mixed, mixed_student), (tmp_path / "s.gguf", layout.student)):
        want = student_logits(folder, ids)
        assert_close_to_f32(llama_cpp_logits(llama_cpp_model(gguf_file), ids), want, folder)


def test_attn_linear_block_trains_assembles_and_export_refuses(tiny_built, tmp_path):
    """b00 (2 layers) with only ``conversion: attn_linear``: the same bits twice and with online targets; no KV cache
    for its layers; the student ships zg's modeling file, loads, generates with its cache; export refuses it."""
    from zgtrain.student.assemble import assemble, build_student
    from zgtrain.student.load import load_student

    root = b00_converted(tiny_built, tmp_path / "proj", "attn_linear", steps=3)
    layout = Layout(root)
    first = train_block(project_of(root), "b00", restart=True, layout=layout).metrics()
    assert first["conversion"] == "attn_linear" and first["kv_bytes_per_token"] == 0 and first["kv_ratio"] == 0
    assert read_json(layout.block_dir("b00") / "meta.json")["attention"] == ["linear", "linear"]
    w1 = b00_weights(root)
    assert w1["layers.0.self_attn.linear.weight"].shape == (64, 64)
    assert not any("q_proj" in k for k in w1)
    again = train_block(project_of(root), "b00", restart=True, layout=layout).metrics()
    assert again["state_sha256"] == first["state_sha256"]
    assert all(torch.equal(v, w1[k]) for k, v in b00_weights(root).items())
    online = copy_project(root, tmp_path / "online")
    shutil.rmtree(online / "data" / "boundaries")
    res = train_block(project_of(online), "b00", targets="online", restart=True, layout=Layout(online)).metrics()
    assert res["state_sha256"] == first["state_sha256"] and res["heldout_loss"] == first["heldout_loss"]

    train_block(project_of(root), "b01", restart=True, layout=layout)
    assemble(project_of(root), layout=layout)
    summary = read_json(layout.student / "zerograph.json")
    assert summary["layer_attention"] == ["linear", "linear", "full", "full"] and summary["remote_code"] is True
    assert summary["kv_bytes_per_token"] == 2 * 2 * PER_HEAD and summary["kv_ratio"] == 0.5
    assert "layer_kv_heads" not in summary
    model = load_student(layout.student)
    assert type(model).__name__ == "ZgLlamaForCausalLM"
    built, _ = build_student(project_of(root), layout=layout)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, built(input_ids=ids).logits)
    _generates(model, model.config.vocab_size)
    for fmt in ("hf", "gguf"):
        out = root / "models" / f"out-{fmt}"
        res = zg_main("export", "student", "--format", fmt, "--out", str(out), cwd=root, check=False)
        assert_user_error(res, "layer 0 has a linear map in place of attention (conversion attn_linear)")
        assert not out.exists()

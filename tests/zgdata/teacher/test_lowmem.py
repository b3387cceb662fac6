"""zgdata.teacher.lowmem: an MoE checkpoint read without mapping it and saved without copying its experts gives
the same tensors and the same files as transformers' own load and save, and transformers is left as it was."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from zgdata.core.hashing import tensors_sha256
from zgdata.teacher.lowmem import SYNC_ENV, chunks_as_views, read_not_mapped
from zgdata.teacher.prepare import tiny_teacher


def _files(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe"])
def test_lean_load_and_save_keep_every_byte(tmp_path, model_type):
    import transformers.modeling_utils as mu
    from transformers.core_model_loading import Chunk

    model, _ = tiny_teacher(model_type)
    src = tmp_path / "src"
    model.to(torch.bfloat16).save_pretrained(src, max_shard_size="200KB")
    files = sorted(src.glob("*.safetensors"))
    plain = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    opened, convert = mu.safe_open, Chunk.convert
    with read_not_mapped(files):
        assert os.environ[SYNC_ENV] == "1" and mu.safe_open is not opened
        lean = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    assert mu.safe_open is opened and SYNC_ENV not in os.environ  # restored
    assert tensors_sha256(lean.state_dict()) == tensors_sha256(plain.state_dict())
    plain.save_pretrained(tmp_path / "plain")
    with chunks_as_views():
        lean.save_pretrained(tmp_path / "lean")
    assert Chunk.convert is convert
    assert _files(tmp_path / "lean") == _files(tmp_path / "plain")

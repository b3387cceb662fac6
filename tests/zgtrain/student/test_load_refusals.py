"""load_student refuses, with one line and before transformers opens anything, a student folder whose weights are
not safetensors: a 2^62-byte header length, a pickled pytorch_model.bin alone or beside other safetensors (zg never
unpickles)."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import pytest

from zgdata.errors import ZgError
from zgtrain.student.load import CHECKSUMS, load_student


class _Boom:
    """Unpickling this creates a file: the proof that something was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _student(reproduced, tmp_path) -> Path:
    folder = tmp_path / "student"
    shutil.copytree(reproduced / "models" / "student", folder)
    return folder


def test_a_huge_header_length_in_the_students_weights_is_one_line(reproduced, tmp_path):
    folder = _student(reproduced, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(struct.pack("<Q", 2**62) + data[8:])
    with pytest.raises(ZgError) as e:
        load_student(folder)
    assert f"declares a {2**62}-byte header" in str(e.value) and "\n" not in str(e.value)


def test_a_student_folder_with_only_a_pickle_is_refused_before_unpickling(reproduced, tmp_path):
    folder = _student(reproduced, tmp_path)
    marker = tmp_path / "unpickled"
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(ZgError, match="holds pickled weights \\(pytorch_model.bin\\), which zg never loads"):
        load_student(folder)
    assert not marker.exists()


def test_a_pickle_beside_other_safetensors_is_refused_before_transformers_falls_back_to_it(reproduced, tmp_path):
    """No model.safetensors but a decoy.safetensors its author listed in checksums.json, and a pytorch_model.bin:
    transformers would load the .bin (its fallback when model.safetensors is missing), which no checksum covers."""
    folder = _student(reproduced, tmp_path)
    marker = tmp_path / "unpickled"
    (folder / "model.safetensors").rename(folder / "decoy.safetensors")
    sums = json.loads((folder / CHECKSUMS).read_text())
    sums["decoy.safetensors"] = sums.pop("model.safetensors")
    (folder / CHECKSUMS).write_text(json.dumps(sums))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(ZgError, match="holds pickled weights \\(pytorch_model.bin\\), which zg never loads"):
        load_student(folder)
    assert not marker.exists()

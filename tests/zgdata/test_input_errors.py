"""A malformed input is refused with one line naming the file and what to do, never a traceback."""

from __future__ import annotations

import struct

from tests.helpers.assertions import assert_user_error
from tests.helpers.runners import zg_main


def test_a_non_utf8_byte_in_params_yaml_is_one_line(tiny_project):
    params = tiny_project / "params.yaml"
    params.write_bytes(params.read_bytes() + b"# caf\xe9\n")
    res = zg_main("data", "tokenize", cwd=tiny_project, check=False)
    assert_user_error(res, "params.yaml is not UTF-8 text: byte 0xe9 at line", "save it as UTF-8")


def test_an_invalid_teacher_slice_header_is_one_line(tiny_project):
    path = tiny_project / "models" / "teacher" / "blocks" / "b00.safetensors"
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[:8] + b"\xff" * n + data[8 + n :])  # same length, not JSON
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, "b00.safetensors is not a valid safetensors file: its header is not JSON", "dvc checkout")
    path.write_bytes(struct.pack("<Q", 2**62) + data[8:])
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(res, f"declares a {2**62}-byte header in a {len(data)}-byte file")

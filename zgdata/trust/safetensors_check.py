"""A safetensors file's header, checked before any library parses it.

The format is an 8-byte little-endian header length, that many bytes of JSON, then the tensor data. A header length
of 2^62, a header that is not JSON, or a file shorter than its own header would otherwise surface as a library's
panic or a traceback (or an attempt to allocate the stated length). ``check_header`` reads at most the header and
refuses such a file with one line; the tensors themselves are left to safetensors, which checks their offsets.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["check_header", "MAX_HEADER"]

MAX_HEADER = 100 << 20  # safetensors' own limit on the header (100 MB)


def check_header(path: Path | str, *, fix: str) -> dict:
    """The parsed header of ``path``; a ZgError naming the file and ``fix`` when it is not a safetensors header."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > min(size - 8, MAX_HEADER):
            what = (
                "is shorter than a safetensors header"
                if n is None
                else f"declares a {n}-byte header in a {size}-byte file"
            )
            raise ZgError(f"{path} is not a valid safetensors file: it {what}", fix=fix)
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ZgError(f"{path} is not a valid safetensors file: its header is not JSON ({e})", fix=fix) from e
    if not isinstance(header, dict):
        raise ZgError(f"{path} is not a valid safetensors file: its header is not a JSON object", fix=fix)
    return header

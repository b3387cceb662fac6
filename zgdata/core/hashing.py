"""Content hashes and fingerprints. Hash content, never mtimes; never fall back to random ids."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zgdata.errors import ZgError

if TYPE_CHECKING:
    import torch

__all__ = ["sha256_bytes", "file_sha256", "tensors_sha256", "fingerprint", "canonical_json"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (weights files, modeling code, tokenizer files, exports)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of each tensor, names sorted."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")  # the tensor's memory, no copy
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ZgError(
            f"cannot hash {obj!r} for a fingerprint: {e}",
            fix="use plain JSON values (str, int, float, list, dict) in params",
        ) from e


def fingerprint(kind: str, version: int, inputs: Mapping[str, Any]) -> str:
    """Identity of a derived artifact: its transform's name and version plus its sorted inputs."""
    for k, v in inputs.items():
        if v is None or v == "":
            raise ZgError(
                f"fingerprint input '{k}' of {kind} is missing",
                fix="regenerate the parent artifact; ZeroGraph never invents an id",
            )
    return sha256_bytes(canonical_json({"kind": kind, "version": version, "inputs": dict(inputs)}).encode())

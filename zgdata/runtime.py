"""Side effects in one place: device selection and thread settings.

Everything else takes tensors and explicit ``torch.Generator`` objects. The device is
CPU unless ``ZG_DEVICE`` says otherwise (e.g. ``cuda`` or ``cuda:1``); tests and the
default conversion never need a GPU. Bitwise guarantees hold per device: a run and its
resume (or its cached/online twin) must use the same device.
"""

from __future__ import annotations

import os

import torch

from zgdata.errors import ZgError

__all__ = ["device"]


def device() -> torch.device:
    name = os.environ.get("ZG_DEVICE", "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ZgError(f"ZG_DEVICE={name!r} is not a torch device", fix="use cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ZgError(f"ZG_DEVICE={name} but this torch has no CUDA device",
                      fix="unset ZG_DEVICE, or install a CUDA build of torch (make setup TORCH_SPEC=...)")
    if dev.type == "cuda":
        # determinism over speed: the guarantees are bitwise
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return dev

"""Loading and saving a teacher with one copy of its weights in memory, not two (bench/moe_memory.py measures it;
the figures: docs/results/moe-memory.md).

transformers 5 loads a checkpoint by mapping each safetensors file and, on a thread pool, materializing every
tensor ahead of the parameter that needs it. For a dense model in its stored dtype the parameters are views of the
mapped files (nothing is copied). A mixture-of-experts checkpoint stores each expert's matrices apart, and the
loader stacks them into the fused ``gate_up_proj`` / ``down_proj``: the stack is a copy, while every page of the
mapped files it read stays in the process's resident memory as long as any view of those files lives (the small
tensors that needed no conversion are such views). Loading an MoE teacher so peaks at its weights twice: once
fused, once mapped. Saving it back (``save_pretrained``, which writes the experts one by one again) copies each
``gate_up_proj`` chunk before writing it: another two thirds of the experts.

- ``read_not_mapped``: while open, ``from_pretrained`` reads each tensor with pread into its own memory (the
  safetensors ``pread`` backend, which transformers itself uses where mapping is not wanted) and only when the
  parameter that needs it is converted (transformers' synchronous loading): no mapped page, and one layer's
  expert list in flight. The tensors read are the same bytes either way.
- ``chunks_as_views``: while open, the reverse of a ``Concatenate`` (``Chunk``, used by ``save_pretrained``)
  returns views, not copies; ``save_pretrained`` makes every tensor it writes contiguous anyway, so the bytes on
  disk are the same (an expert's half of ``gate_up_proj`` is a contiguous block already: no copy at all).
- ``unshared``: a block slice's tensors for safetensors' save_file as views of the parameters (it writes from
  them), a tied one cloned; prepare's slices were whole copies before.

Both patch transformers while open and restore it on exit, like zgdata.teacher.prepare's ``_gguf_parsed_once``;
where this transformers or safetensors lacks what they patch, they change nothing (the load or save is then
transformers' own, at its own memory cost).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["read_not_mapped", "chunks_as_views", "unshared", "SYNC_ENV"]

SYNC_ENV = "HF_DEACTIVATE_ASYNC_LOAD"  # transformers' switch for materializing each tensor when its parameter loads


def _pread_supported(file: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt", backend="pread"):
            return True
    except TypeError:  # a safetensors without backends
        return False


@contextmanager
def read_not_mapped(files: list[Path]):
    """While open, transformers' ``from_pretrained`` reads safetensors with pread, one parameter at a time.
    ``files``: the checkpoint's safetensors files (one is opened to check that this safetensors can pread)."""
    import transformers.modeling_utils as mu

    original = getattr(mu, "safe_open", None)
    if original is None or not files or not _pread_supported(files[0]):
        yield
        return

    def pread_open(file, framework="pt", device="cpu", backend="mmap"):
        return original(file, framework=framework, device=device, backend="pread" if device == "cpu" else backend)

    env = os.environ.get(SYNC_ENV)
    mu.safe_open, os.environ[SYNC_ENV] = pread_open, "1"
    try:
        yield
    finally:
        mu.safe_open = original
        if env is None:
            os.environ.pop(SYNC_ENV, None)
        else:
            os.environ[SYNC_ENV] = env


@contextmanager
def chunks_as_views():
    """While open, transformers' ``Chunk`` conversion op returns views of its input (``torch.chunk``) instead of
    contiguous copies."""
    import torch

    try:
        from transformers.core_model_loading import Chunk
    except ImportError:
        yield
        return
    original = Chunk.__dict__.get("convert")
    if original is None or not hasattr(Chunk, "get_target_patterns"):
        yield
        return

    @torch.no_grad()
    def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
        if len(input_dict) > 1:
            return original(self, input_dict, source_patterns, target_patterns, **kwargs)
        tensors = next(iter(input_dict.values()))
        tensor = tensors[0] if isinstance(tensors, list) else tensors
        targets = self.get_target_patterns(target_patterns, **kwargs)
        return dict(zip(targets, torch.chunk(tensor, len(targets), dim=self.dim)))

    Chunk.convert = convert
    try:
        yield
    finally:
        Chunk.convert = original


def unshared(tensors: dict) -> dict:
    """``tensors`` as save_file takes them, without copying: contiguous, and a tensor that is another one in the
    dict (a tied LM head and embedding) cloned, since safetensors refuses overlapping tensors. The rest stay views
    of the model's parameters (save_file writes from them; views of one storage that do not overlap it accepts)."""
    out, seen = {}, set()
    for k, v in tensors.items():
        v = v.detach().contiguous()
        key = (v.data_ptr(), v.dtype, tuple(v.shape), v.stride())
        out[k] = v.clone() if key in seen and v.numel() else v
        seen.add(key)
    return out

"""A local transformers model directory as the teacher source: check it, load it once, say where it came from.

Checked before anything loads, from the safetensors headers alone (no tensor is read):
- a sharded checkpoint (``model.safetensors.index.json`` + ``model-0000K-of-0000N.safetensors``): every shard the
  index names exists, is a readable safetensors file, and holds every tensor the index maps to it;
- a single ``model.safetensors`` (which transformers loads in preference to an index beside it) is readable.
Without this, a missing shard fails deep inside transformers, and a tensor missing from a shard comes up randomly
initialized with only a warning. After loading, any weight the model expects but did not find is refused too.

The model is loaded once, straight into the prepared dtype (``teacher.dtype``): transformers reads the files shard
by shard and casts each tensor as it reads it, so no whole-model copy in another dtype (e.g. fp32 of a bf16
checkpoint) ever exists. ``auto`` keeps the checkpoint's stored dtype (config.json's ``dtype``), the way to prepare
a teacher too big for memory in fp32. A mixture-of-experts checkpoint is read without mapping its files
(``lean_load``, zgdata.teacher.lowmem), so its fused experts are the only copy of its weights in memory. The block slices are then cut from this one in-memory model
(zgdata.teacher.prepare.write_slices): nothing is read twice.

``source_files`` (the sha256 of config.json, the index and every weight file) goes into teacher.json, so a prepared
teacher names the exact checkpoint it came from, not only a path.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext
from pathlib import Path

import torch

from zgdata.errors import ZgError
from zgdata.families.registry import family
from zgdata.teacher.lowmem import read_not_mapped

__all__ = ["INDEX", "SINGLE", "weight_files", "source_files", "load_dir", "lean_load"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
KEY = "teacher.source"


def _complete(path: Path) -> str:
    return f"copy the complete checkpoint (every file {INDEX} names) into {path}, or point teacher.source at one"


def _header_keys(file: Path, path: Path) -> set[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return set(f.keys())
    except Exception as e:  # SafetensorError, OSError: a truncated or foreign file
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ZgError(
            f"{file} is not a readable safetensors file ({why})",
            key=KEY,
            fix=f"re-copy that file from the original checkpoint; {_complete(path)}",
        ) from e


def _index(path: Path) -> dict[str, str]:
    """The index's weight_map {tensor: shard file name}, or a one-line error."""
    file = path / INDEX
    try:
        weight_map = json.loads(file.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise ZgError(
            f"{file} is not a readable checkpoint index ({type(e).__name__})",
            key=KEY,
            fix=f"restore it from the original checkpoint; {_complete(path)}",
        ) from e
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
    ):
        raise ZgError(
            f"{file} has no weight_map of tensor names to shard files",
            key=KEY,
            fix=f"restore it from the original checkpoint; {_complete(path)}",
        )
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:  # shard names are plain file names in this directory
            raise ZgError(
                f"{file} maps tensors to {shard!r}, which is not a file name in {path}",
                key=KEY,
                fix=f"restore the index from the original checkpoint; {_complete(path)}",
            )
    return weight_map


def weight_files(path: Path) -> list[str]:
    """The safetensors files a load of ``path`` reads (relative names), after checking they are complete.

    Empty when the directory holds no safetensors weights (``load_dir`` then refuses it: pickles are never loaded)."""
    if (path / SINGLE).exists():  # transformers' own order: a single file wins over an index beside it
        _header_keys(path / SINGLE, path)
        return [SINGLE]
    if (path / INDEX).exists():
        weight_map = _index(path)
        by_shard: dict[str, set[str]] = {}
        for tensor, shard in weight_map.items():
            by_shard.setdefault(shard, set()).add(tensor)
        for shard in sorted(by_shard):
            if not (path / shard).is_file():
                raise ZgError(
                    f"{path / shard} is missing: {INDEX} maps {len(by_shard[shard])} tensors to it",
                    key=KEY,
                    fix=_complete(path),
                )
        for shard in sorted(by_shard):
            lacking = sorted(by_shard[shard] - _header_keys(path / shard, path))
            if lacking:
                more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
                raise ZgError(
                    f"{path / shard} lacks tensor '{lacking[0]}'{more} that {INDEX} maps to it "
                    f"(a truncated or mismatched shard)",
                    key=KEY,
                    fix=f"re-copy that shard from the same checkpoint revision; {_complete(path)}",
                )
        return [INDEX, *sorted(by_shard)]
    return []


PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "tf_model.h5", "flax_model.msgpack")


def _no_custom_code(path: Path) -> None:
    """Refuse a model directory whose config or tokenizer config names its own Python code (``auto_map``): zg
    runs a teacher with transformers' own classes, and code it did not write and pin never runs."""
    for name in ("config.json", "tokenizer_config.json"):
        try:
            doc = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("auto_map"):
            classes = ", ".join(sorted(doc["auto_map"])) if isinstance(doc["auto_map"], dict) else "custom classes"
            raise ZgError(
                f"{path / name} names custom code (auto_map: {classes}); zg never runs a teacher's own Python files",
                key=KEY,
                fix="use a checkpoint of a family transformers ships (its config without auto_map), e.g. one saved "
                "by save_pretrained from transformers' own classes",
            )


def _no_pickles(path: Path) -> None:
    """Refuse a directory whose only weights are pickled (torch.load of a pickle can run code) with one line."""
    pickled = [n for n in PICKLES if (path / n).exists()] + sorted(p.name for p in path.glob("pytorch_model-*.bin"))
    if pickled:
        raise ZgError(
            f"{path} holds only pickled weights ({', '.join(pickled[:3])}); zg loads safetensors only, since "
            "unpickling a file can run code",
            key=KEY,
            fix="convert it once where you trust it: `AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir2)` "
            "writes model.safetensors",
        )
    raise ZgError(
        f"{path} holds no weights (no {SINGLE} or {INDEX})",
        key=KEY,
        fix="point teacher.source at a complete checkpoint",
    )


def source_files(path: Path, weights: list[str]) -> dict[str, str]:
    """{relative name: sha256} of config.json and the weight files (teacher.json ``source_files``)."""
    out = {}
    for name in sorted({"config.json", *weights}):
        with open(path / name, "rb") as f:
            out[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def lean_load(fam, path: Path, weights: list[str]):
    """How a checkpoint of ``fam`` loads with one copy of its weights: an MoE one (whose experts transformers
    stacks into fused tensors, copies) read without mapping its files (zgdata.teacher.lowmem); any other mapped, as
    transformers does (its parameters are views of the files: no copy, and processes share the pages)."""
    if getattr(fam, "moe", None) is None:
        return nullcontext()
    return read_not_mapped([path / w for w in weights if w.endswith(".safetensors")])


def load_dir(path: Path, dtype: str):
    """(model, tokenizer, {"source_files": ...}) of a model directory, loaded once in ``dtype`` (or ``auto``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").exists():
        raise ZgError(
            f"{path} is a directory but not a transformers model (no config.json)",
            key=KEY,
            fix="point teacher.source at a directory written by save_pretrained",
        )
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ZgError(
            f"{path / 'config.json'} is not a readable model config ({type(e).__name__})",
            key=KEY,
            fix="point teacher.source at a directory written by save_pretrained",
        ) from e
    fam = family(str(model_type))  # an unsupported family stops here, before any weight is read
    _no_custom_code(path)
    weights = weight_files(path)  # so does an incomplete checkpoint
    if not weights:
        _no_pickles(path)
    try:
        # never a model's own code: a teacher runs transformers' classes (its auto_map was refused above)
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        with lean_load(fam, path, weights):
            model, info = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=dtype if dtype == "auto" else getattr(torch, dtype),
                output_loading_info=True,
                trust_remote_code=False,
                use_safetensors=True,
            )
    except Exception as e:  # transformers raises many types for a bad directory
        raise ZgError(
            f"could not load model directory {path}: {e}".split("\n")[0],
            key=KEY,
            fix="check the directory holds weights, config.json and a tokenizer",
        ) from e
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would have initialized them randomly
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ZgError(
            f"the weights in {path} lack '{missing[0]}'{more}, which the model's config.json needs",
            key=KEY,
            fix=f"{_complete(path)} (weights and config.json of the same model)",
        )
    # The path it was loaded from is provenance, recorded in teacher.json; in the saved config and the slices'
    # metadata it would make two copies of one checkpoint (sharded or not, here or there) prepare different bytes.
    model.config._name_or_path = ""
    return model, tok, {"source_files": source_files(path, weights)}

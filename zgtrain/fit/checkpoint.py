"""Block checkpoints: the one module that knows their format.

models/blocks/KEY/
  meta.json           run identity (config, boundary fingerprints, teacher sha256, versions) + step;
                      it names the latest complete checkpoint and is replaced atomically after it
  init.safetensors    the converted, untrained block (for "untrained" evaluation)
  ckpt-NNNNNN/        model.safetensors, optimizer.safetensors + optimizer.json, rng.safetensors + rng.json,
                      curve.json
  model.safetensors   final weights (when done); meta.json's weights_sha256 is this file's sha256, checked on
                      every load (a block finished before it was recorded is refused: retrain it)

Everything is safetensors or JSON: loading a checkpoint pulled from a remote never unpickles,
so it cannot run code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zgdata.core.atomic import atomic_path, write_json
from zgdata.core.hashing import file_sha256, tensors_sha256
from zgdata.core.paths_guard import inside
from zgdata.core.runtime import rng_state, set_rng_state
from zgdata.errors import ZgError, dvc_checkout
from zgtrain.fit.rerun import rerun_of

__all__ = [
    "FORMAT_VERSION",
    "read_meta",
    "save_weights",
    "checkpoint_dir",
    "save",
    "restore",
    "state_sha256",
    "load_tensors",
    "reload_fix",
    "finish",
    "check_weights",
    "check_checkpoint",
]

FORMAT_VERSION = 2  # 1: optimizer.pt / rng.pt pickles (no longer loaded)


def reload_fix(d: Path) -> str:
    """The fix of every refusal of a run folder's files: restore them from DVC, or retrain the run (its own
    command and stage: a block's, a variant's, a local block's, a repair's; zgtrain/fit/rerun.py)."""
    return rerun_of(d).restore()


def read_meta(d: Path) -> dict | None:
    """The block directory's meta.json, or None when the block was never started."""
    path = Path(d) / "meta.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is not valid JSON ({e})", fix=reload_fix(d)) from e


def save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    with atomic_path(path, durable=True) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))


def load_tensors(path: Path, run: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file of the run folder ``run`` (named in the advice of a refusal)."""
    from safetensors.torch import load_file

    if not path.exists():
        raise ZgError(f"{path} is missing (the checkpoint's meta.json points at it)", fix=reload_fix(run))
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for a damaged header or body
        raise ZgError(f"{path} is not a readable safetensors file ({str(e)[:120]})", fix=reload_fix(run)) from e


def _load_json(path: Path, run: Path):
    if not path.exists():
        raise ZgError(f"{path} is missing (the checkpoint's meta.json points at it)", fix=reload_fix(run))
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is not valid JSON ({e})", fix=reload_fix(run)) from e


def _optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for name, v in state.items():
            if torch.is_tensor(v):
                tensors[f"state.{idx}.{name}"] = v
            else:
                scalars.setdefault(str(idx), {})[name] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _set_optimizer_state(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], values: dict) -> None:
    state: dict[int, dict] = {}
    for name, v in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = v
    for idx, kv in values.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(kv)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in values["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})


def save(d: Path, meta: dict, block, opt, gen: torch.Generator, curve: list, step: int) -> None:
    """Write ckpt-STEP/ fully, then point meta.json at it (atomic rename), then drop older ones."""
    import shutil

    from safetensors.torch import save_file

    name = f"ckpt-{step:06d}"
    # on the disk before meta.json points at it, and meta.json before the older checkpoints go: a power loss leaves
    # meta.json naming a whole checkpoint, the new one or the one before it
    with atomic_path(d / name, durable=True) as tmp:
        tmp.mkdir(parents=True)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in block.weights().items()}, str(tmp / "model.safetensors")
        )
        tensors, values = _optimizer_state(opt)
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(values, sort_keys=True))
        tensors, values = rng_state(gen)
        save_file(tensors, str(tmp / "rng.safetensors"))
        (tmp / "rng.json").write_text(json.dumps(values, sort_keys=True))
        (tmp / "curve.json").write_text(json.dumps(curve))
        digests = {f.name: file_sha256(f) for f in sorted(tmp.iterdir())}
    record = {"step": step, "checkpoint": name, "checkpoint_format": FORMAT_VERSION, "checkpoint_sha256": digests}
    write_json(d / "meta.json", {**meta, **record}, durable=True)
    for old in d.glob("ckpt-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(d: Path, meta: dict, *, fix: str) -> Path:
    """The checkpoint folder run folder ``d``'s meta.json names, refused unless it resolves inside ``d``."""
    return inside(Path(d) / str(meta.get("checkpoint")), d, what="the checkpoint meta.json names,", fix=fix)


def restore(d: Path, meta: dict, block, opt, gen: torch.Generator) -> list:
    """Load the checkpoint ``meta`` names into block, optimizer and generator; return the loss curve so far."""
    afresh = f"rerun with `{rerun_of(d).restart}` to start it afresh"
    if meta.get("checkpoint_format") != FORMAT_VERSION:
        raise ZgError(
            f"{d} holds a checkpoint in an older format ({meta.get('checkpoint_format', 1)}, pickled "
            f"optimizer/RNG state) that zg no longer loads",
            fix=afresh,
        )
    c = checkpoint_dir(d, meta, fix=afresh)
    check_checkpoint(c, meta)
    weights = load_tensors(c / "model.safetensors", d)
    missing, unexpected = block.load_state_dict(weights, strict=False)
    if unexpected or any(not m.startswith("rotary_emb.") for m in missing):
        raise ZgError(f"{c / 'model.safetensors'} does not fit the model of {d}", fix=reload_fix(d))
    _set_optimizer_state(opt, load_tensors(c / "optimizer.safetensors", d), _load_json(c / "optimizer.json", d))
    set_rng_state(gen, load_tensors(c / "rng.safetensors", d), _load_json(c / "rng.json", d))
    return _load_json(c / "curve.json", d)


def check_checkpoint(c: Path, meta: dict) -> None:
    """Refuse checkpoint folder C unless every file a resume reads is the one its save wrote (meta.json's
    ``checkpoint_sha256``): a damaged checkpoint is named as such, never resumed into a run that then diverges."""
    want, run = meta.get("checkpoint_sha256"), rerun_of(c)
    fix = f"rerun with `{run.restart}` (or restore the folder: `{dvc_checkout(run.folder)}`)"
    if not isinstance(want, dict) or not want:
        raise ZgError(f"{c} has no recorded digests (a checkpoint of an older zg)", fix=fix)
    for name, sha in sorted(want.items()):  # what a resume reads; any other file there is never read
        path = Path(c) / name
        if not path.is_file():
            raise ZgError(f"{path} is missing (the checkpoint's meta.json records it)", fix=fix)
        got = file_sha256(path)
        if got != sha:
            raise ZgError(
                f"{Path(c) / name} is not the file its save wrote (sha256 {got[:12]}, meta.json records {sha[:12]})",
                fix=fix,
            )


def state_sha256(block, opt) -> str:
    """sha256 over final weights and optimizer tensors, in canonical order."""
    tensors = {f"model.{k}": v for k, v in block.weights().items()}
    names = {id(p): n for n, p in block.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v):
                    tensors[f"opt.{names[id(p)]}.{k}"] = v
    return tensors_sha256(tensors)


def finish(d: Path, meta: dict, block, opt, gen: torch.Generator, curve: list, step: int) -> None:
    """The final weights, then the last checkpoint, whose meta.json marks the block done: done implies weights.
    meta.json records the weights file's sha256 (``weights_sha256``; ``meta`` is updated with it)."""
    save_weights(block.weights(), Path(d) / "model.safetensors")
    meta["weights_sha256"] = file_sha256(Path(d) / "model.safetensors")
    save(d, meta, block, opt, gen, curve, step)


def check_weights(d: Path, meta: dict) -> None:
    """Refuse a finished run folder whose model.safetensors is not the file meta.json recorded."""
    want, path = meta.get("weights_sha256"), Path(d) / "model.safetensors"
    if want is None:  # fail closed: a finished block of an older zg recorded no digest
        raise ZgError(
            f"{Path(d) / 'meta.json'} records no weights_sha256 for {path.name} (a block finished by an older zg)",
            fix=f"re-record it by training it again: {rerun_of(d).commands()}",
        )
    got = file_sha256(path) if path.exists() else None
    if got != want:
        raise ZgError(
            f"{path} is not the file its training wrote (sha256 {str(got)[:12]}, meta.json records {want[:12]})",
            fix=reload_fix(d),
        )

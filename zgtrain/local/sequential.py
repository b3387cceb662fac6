"""Greedy local pretraining, sequential (dataset-centric) mode: one DVC stage per block.

Block k trains to the end alone (``zg train local-block bNN``), then runs once more over every
token row and writes its outputs as ``data/local/hNN.lance`` (float32, row r = token row r), whose
lineage is block k's ``state_sha256`` and its own input's fingerprint. Block k+1 trains from that
dataset; its checkpoint's identity names that fingerprint. DVC therefore reruns blocks k..K-1, and
only those, when block k's params (``local.blocks.bNN``) change. ``zg train local-export`` loads every
block's final weights into the model and writes ``models/local/hf`` and ``metrics/local.json``.

Every block starts from the same seeded init as in simultaneous mode and sees the same batches, so
block 0 ends bitwise equal to block 0 of a simultaneous run with the same params.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.atomic import atomic_path, write_json
from zgdata.errors import ZgError
from zgdata.hashing import canonical_json, sha256_bytes
from zgdata.layout import Layout, boundary_name
from zgdata.lance_io import encode_meta, hidden_field, open_dataset, schema_meta, tensor_column, to_arrow_hidden
from zgdata.lock import project_lock
from zgdata.progress import progress
from zgdata.reader import step_rows
from zgtrain.fit import checkpoint
from zgtrain.project.config import ProjectConfig
from zgtrain.local.simultaneous import _NOT_IDENTITY, adamw, build, heldout_scores, local_paths, lr_at

__all__ = ["train_block", "export", "boundary_path", "SEQ_VERSION"]

SEQ_VERSION = 1
_KIND = "local_boundary"


def boundary_path(layout: Layout, layer: int) -> Path:
    return layout.root / "data" / "local" / f"{boundary_name(layer)}.lance"


def block_dir(layout: Layout, key: str) -> Path:
    return local_paths(layout)["dir"] / "blocks" / key


def _sequential(project: ProjectConfig) -> None:
    if project.local.mode != "sequential":
        raise ZgError(f"local.mode is {project.local.mode}: all blocks train at once", key="local.mode",
                      fix="run `zg train local`, or set local.mode: sequential and run `zg pipeline`")


def _open_input(path: Path, upstream: str, layer: int, tokens_fp: str):
    ds = open_dataset(path, kind=_KIND)
    meta = schema_meta(ds.schema)
    want = {"block": upstream, "layer": layer, "tokens_fingerprint": tokens_fp}
    for k, v in want.items():
        if meta.get(k) != v:
            raise ZgError(f"{path} was written with {k}={meta.get(k)!r}, this run needs {v!r}",
                          fix=f"rerun the block that writes it: `dvc repro local_{upstream}`")
    return ds, meta


def _take(ds, rows: np.ndarray) -> torch.Tensor:
    """(B, T, C) float32 rows in the given order (Lance takes sorted ids faster; the order is restored)."""
    uniq, inverse = np.unique(rows, return_inverse=True)
    table = ds.take(uniq.astype(np.int64), columns=["hidden"])
    return tensor_column(table, "hidden", ds.schema.field("hidden")).clone()[torch.from_numpy(inverse)]


def _write_outputs(path: Path, blk, ids: torch.Tensor, inputs, meta: dict, batch_size: int, width: int) -> None:
    """Block outputs over every token row, as a Lance dataset committed whole (atomic rename)."""
    import lance

    dev = next(blk.parameters()).device
    blk.eval()
    n, t = ids.shape
    schema = pa.schema([pa.field("seq_id", pa.int64()), hidden_field("hidden", t, width, "float32")],
                       metadata=encode_meta({**meta, "kind": _KIND, "complete": True}))

    def batches():  # a generator runs when Lance pulls from it, so it holds no_grad itself
        for i in range(0, n, batch_size):
            rows = np.arange(i, min(i + batch_size, n))
            x = ids[rows] if inputs is None else _take(inputs, rows)
            with torch.no_grad():  # the boundary only: the block's head and loss are not needed here
                h = blk.boundary(x.to(dev))
            yield pa.record_batch([pa.array(rows, type=pa.int64()), to_arrow_hidden(h.cpu(), "float32")],
                                  schema=schema)

    with atomic_path(path) as tmp:
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(tmp), mode="create")


def train_block(project: ProjectConfig, key: str, *, stop_after: int | None = None, restart: bool = False,
                layout: Layout = Layout()) -> dict:
    """Train block KEY to its steps from its input dataset (token ids for b00), then write its outputs."""
    _sequential(project)
    if stop_after is not None and stop_after < 1:
        raise ZgError(f"--stop-after is {stop_after}", key="--stop-after", fix="give a number of steps >= 1")
    d = block_dir(layout, key)
    with project_lock(layout, f"local-{key}", writes=d):
        run = build(project, layout)
        if key not in run.keys:
            raise ZgError(f"block '{key}' is not in the partition {run.identity['boundaries']}", key="partition",
                          fix=f"use one of {', '.join(run.keys)}")
        i = run.keys.index(key)
        blk, cfg, gen, last = run.blocks[i], run.bcfgs[i], run.gens[i], i == len(run.keys) - 1
        lo, hi = run.identity["boundaries"][i], run.identity["boundaries"][i + 1]
        tokens_fp = run.identity["tokens_fingerprint"]
        inputs, in_fp = None, tokens_fp
        if i:
            inputs, in_meta = _open_input(boundary_path(layout, lo), run.keys[i - 1], lo, tokens_fp)
            in_fp = in_meta["fingerprint"]
        opt = adamw(blk, cfg)
        identity = {**{k: v for k, v in run.identity.items() if k != "config"}, "seq_version": SEQ_VERSION,
                    "key": key, "input_fingerprint": in_fp,
                    "config": {k: v for k, v in asdict(cfg).items() if k not in _NOT_IDENTITY}}
        prior = None if restart else checkpoint.read_meta(d)
        if prior is not None and {k: prior.get(k) for k in identity} != identity:
            raise ZgError(f"{d} holds a checkpoint of another run (its params or its input dataset changed)",
                          fix=f"rerun with `zg train local-block {key} --restart`, or restore the old params")
        for dead in d.glob(".*.partial") if d.is_dir() else []:
            shutil.rmtree(dead) if dead.is_dir() else dead.unlink()
        if prior is None:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            checkpoint.save(d, {**identity, "done": False}, blk, opt, gen, [], 0)
            curve, step = [], 0
        else:
            curve, step = checkpoint.restore(d, prior, blk, opt, gen), prior["step"]
        end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
        dev = next(blk.parameters()).device
        sleep = float(os.environ.get("ZG_FAILPOINT_SLEEP_AFTER_STEP", "0"))
        blk.train()
        t0 = time.perf_counter()
        with progress(f"train local {key}", end - step, unit="step") as advance:
            for s in range(step, end):
                rows = step_rows(run.train_rows, s, cfg.batch_size, run.data_seed)
                y = run.ids[rows]
                digest = sha256_bytes(y.numpy().tobytes())[:16]
                x = y if inputs is None else _take(inputs, rows)
                for g in opt.param_groups:
                    g["lr"] = lr_at(cfg, s)
                _, loss, terms = blk(x.to(dev), y.to(dev), mtp_weight=cfg.mtp_weight)
                loss.backward()
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(blk.parameters(), cfg.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise ZgError(f"local block {key}: loss became {value} at step {s}; the last good checkpoint is "
                                  f"intact", key=f"local.blocks.{key}.lr", fix="lower its lr and rerun with --restart")
                curve.append({"loss": value, **{k: float(v) for k, v in terms.items()}, "batch": digest})
                advance(1)
                if cfg.checkpoint_every and (s + 1) % cfg.checkpoint_every == 0 and s + 1 < end:
                    checkpoint.save(d, {**identity, "done": False}, blk, opt, gen, curve, s + 1)
                if sleep:
                    time.sleep(sleep)
        seconds = time.perf_counter() - t0
        sha = checkpoint.state_sha256(blk, opt)
        base = {"key": key, "step": end, "steps": cfg.steps, "state_sha256": sha,
                "tokens_sha256": sha256_bytes("".join(c["batch"] for c in curve).encode())}
        if end < cfg.steps:
            checkpoint.save(d, {**identity, "done": False}, blk, opt, gen, curve, end)
            return {"status": "stopped", **base}
        checkpoint.finish(d, {**identity, "done": True, "state_sha256": sha}, blk, opt, gen, curve, end)
        if not last:  # lineage: this block's state and its own input
            lineage = {"block": key, "layer": hi, "state_sha256": sha, "input_fingerprint": in_fp,
                       "tokens_fingerprint": tokens_fp, "seq_version": SEQ_VERSION}
            lineage["fingerprint"] = sha256_bytes(canonical_json(lineage).encode())
            _write_outputs(boundary_path(layout, hi), blk, run.ids, inputs, lineage, cfg.batch_size,
                           run.model.config.hidden_size)
        metrics = {"status": "done", **base, "input_fingerprint": in_fp,
                   "train_loss": float(np.mean([c["loss"] for c in curve[-10:]])) if curve else None,
                   "tokens_per_s": (end - step) * cfg.batch_size * run.ids.shape[1] / seconds
                   if seconds > 0 and end > step else None}
        write_json(layout.root / "metrics" / "local" / f"{key}.json", metrics)
        return metrics


def export(project: ProjectConfig, *, layout: Layout = Layout()) -> dict:
    """Every block's final weights into the model: models/local/hf and the held-out CE in metrics/local.json."""
    from safetensors.torch import load_file

    _sequential(project)
    paths = local_paths(layout)
    with project_lock(layout, "local-export", writes=paths["hf"]):
        run = build(project, layout)
        shas, curves = {}, {}
        for key, blk in zip(run.keys, run.blocks):
            d = block_dir(layout, key)
            meta = checkpoint.read_meta(d)
            if meta is None or not meta.get("done"):
                raise ZgError(f"block {key} has not finished ({d / 'meta.json'})", fix=f"run `dvc repro local_{key}`")
            missing, unexpected = blk.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
            if unexpected or any(not m.startswith("rotary_emb.") for m in missing):
                raise ZgError(f"{d / 'model.safetensors'} does not fit block {key} of this model",
                              fix=f"rerun `dvc repro local_{key}`")
            shas[key] = meta["state_sha256"]
            curves[key] = json.loads((d / meta["checkpoint"] / "curve.json").read_text())
        with atomic_path(paths["hf"]) as tmp:
            run.model.save_pretrained(tmp)
            run.tokenizer.save_pretrained(tmp)
        scores = heldout_scores(paths["hf"], run.blocks, run.keys, run.ids[run.heldout_rows], run.cfg.eval_batch_size)
        metrics = {"status": "done", "mode": "sequential", "k": len(run.keys), "aux": run.cfg.aux, "mtp": run.cfg.mtp,
                   "state_sha256": sha256_bytes("".join(shas[k] for k in run.keys).encode()),
                   "block_state_sha256": shas,
                   "tokens_sha256": sha256_bytes("".join(c["batch"] for c in curves[run.keys[0]]).encode()),
                   **scores,
                   "train_loss": {k: float(np.mean([c["loss"] for c in v[-10:]])) if v else None
                                  for k, v in curves.items()},
                   "tokens_seen": {k: len(v) * run.bcfgs[i].batch_size * int(run.ids.shape[1])
                                   for i, (k, v) in enumerate(curves.items())},
                   "params": sum(p.numel() for p in run.model.parameters())}
        write_json(paths["metrics"], metrics)
        return metrics

"""Greedy local pretraining, sequential (dataset-centric) mode: one DVC stage per block.

Block k trains to the end alone (``zg train local-block bNN``), then runs once more over every
token row and writes its outputs as ``data/local/hNN.lance`` (float32, row r = token row r), whose
lineage is block k's ``state_sha256`` and its own input's fingerprint. Block k+1 trains from that
dataset; its checkpoint's identity names that fingerprint. DVC therefore reruns blocks k..K-1, and
only those, when block k's params (``local.blocks.bNN``) change. ``zg train local-export`` loads every
block's final weights into the model and writes ``models/local/hf`` and ``metrics/local.json``.

Every block starts from the same seeded init as in simultaneous mode and sees the same batches, so
block 0 ends bitwise equal to block 0 of a simultaneous run with the same params. A block's steps run in
the shared loop (zgtrain/fit/loop.py), its resume check is zgtrain/fit/identity.py's, and its files are
named by zgdata/layout.py (``Layout.local_block_dir``, ``local_boundary``, ``local_block_metrics``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from zgdata.core.atomic import atomic_path
from zgdata.core.hashing import canonical_json, sha256_bytes
from zgdata.core.lock import project_lock
from zgdata.core.metrics_file import write_metrics
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.store.lance_io import (
    encode_meta,
    hidden_field,
    open_dataset,
    schema_meta,
    tensor_column,
    to_arrow_hidden,
)
from zgdata.store.reader import step_rows
from zgtrain.fit import checkpoint, loop
from zgtrain.fit.identity import resumable
from zgtrain.local.simultaneous import LocalRun, adamw, build, heldout_scores, local_lr
from zgtrain.project.config import ProjectConfig
from zgtrain.project.local import LocalConfig

__all__ = ["train_block", "export", "LocalBlockResult", "LocalExportResult", "SEQ_VERSION"]

SEQ_VERSION = 1
_KIND = "local_boundary"


@dataclass(kw_only=True)
class LocalBlockResult(loop.Result):
    """What ``train_block`` returns; ``metrics()`` is metrics/local/KEY.json (a stopped run: its STOPPED keys)."""

    STOPPED = ("status", "key", "step", "steps", "state_sha256", "tokens_sha256")
    status: str
    key: str
    step: int
    steps: int
    state_sha256: str
    tokens_sha256: str
    input_fingerprint: str | None = None
    train_loss: float | None = None
    tokens_per_s: float | None = None


@dataclass(kw_only=True)
class LocalExportResult(loop.Result):
    """What ``export`` returns; ``metrics()`` is metrics/local.json of a sequential run."""

    status: str
    mode: str
    k: int
    aux: str
    mtp: str
    state_sha256: str
    block_state_sha256: dict
    tokens_sha256: str
    heldout_ce: float
    block_ce: dict
    heldout_tokens: int
    train_loss: dict
    tokens_seen: dict
    params: int


@dataclass(kw_only=True)
class BlockRun(loop.RunState):
    """One block of a sequential run: what ``_setup`` builds and the loop advances."""

    run: LocalRun  # the whole model, the data and every block at its seeded init (``build``)
    i: int
    key: str
    cfg: LocalConfig  # local: with local.blocks.KEY applied
    opt: torch.optim.Optimizer
    dir: Path
    identity: dict
    inputs: object  # the upstream block's output dataset (None for b00: it reads token ids)
    input_fingerprint: str
    curve: list = field(default_factory=list)

    @property
    def block(self):
        return self.run.blocks[self.i]

    @property
    def gen(self) -> torch.Generator:
        return self.run.gens[self.i]

    def save(self, step: int) -> None:
        """An unfinished checkpoint of ``step`` (``checkpoint.finish`` writes the last one)."""
        checkpoint.save(self.dir, {**self.identity, "done": False}, self.block, self.opt, self.gen, self.curve, step)


def _sequential(project: ProjectConfig) -> None:
    if project.local.mode != "sequential":
        raise ZgError(
            f"local.mode is {project.local.mode}: all blocks train at once",
            key="local.mode",
            fix="run `zg train local`, or set local.mode: sequential and run `zg pipeline`",
        )


def _open_input(path: Path, upstream: str, layer: int, tokens_fp: str):
    if not path.exists():  # a local project has no materialize: the block before writes this boundary
        raise ZgError(
            f"{path} does not exist: block {upstream} writes it",
            fix=f"train {upstream} first: `dvc repro local_{upstream}` (or `zg train local-block {upstream}`)",
        )
    ds = open_dataset(path, kind=_KIND)
    meta = schema_meta(ds.schema)
    want = {"block": upstream, "layer": layer, "tokens_fingerprint": tokens_fp}
    for k, v in want.items():
        if meta.get(k) != v:
            raise ZgError(
                f"{path} was written with {k}={meta.get(k)!r}, this run needs {v!r}",
                fix=f"rerun the block that writes it: `dvc repro local_{upstream}`",
            )
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
    schema = pa.schema(
        [pa.field("seq_id", pa.int64()), hidden_field("hidden", t, width, "float32")],
        metadata=encode_meta({**meta, "kind": _KIND, "complete": True}),
    )

    def batches():  # a generator runs when Lance pulls from it, so it holds no_grad itself
        for i in range(0, n, batch_size):
            rows = np.arange(i, min(i + batch_size, n))
            x = ids[rows] if inputs is None else _take(inputs, rows)
            with torch.no_grad():  # the boundary only: the block's head and loss are not needed here
                h = blk.boundary(x.to(dev))
            yield pa.record_batch([pa.array(rows, type=pa.int64()), to_arrow_hidden(h.cpu(), "float32")], schema=schema)

    with atomic_path(path) as tmp:
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), str(tmp), mode="create")


def _setup(project: ProjectConfig, key: str, *, restart: bool, layout: Layout) -> BlockRun:
    """Block KEY at its seeded init and its input dataset; resumed from its checkpoint when it holds this run."""
    run = build(project, layout)
    if key not in run.keys:
        raise ZgError(
            f"block '{key}' is not in the partition {run.identity['boundaries']}",
            key="partition",
            fix=f"use one of {', '.join(run.keys)}",
        )
    i = run.keys.index(key)
    cfg, lo = run.bcfgs[i], run.identity["boundaries"][i]
    tokens_fp = run.identity["tokens_fingerprint"]
    inputs, in_fp = None, tokens_fp
    if i:
        inputs, in_meta = _open_input(layout.local_boundary(lo), run.keys[i - 1], lo, tokens_fp)
        in_fp = in_meta["fingerprint"]
    identity = {
        **{k: v for k, v in run.identity.items() if k != "config"},
        "seq_version": SEQ_VERSION,
        "key": key,
        "input_fingerprint": in_fp,
        "config": cfg.identity(),
    }
    b = BlockRun(
        run=run,
        i=i,
        key=key,
        cfg=cfg,
        opt=adamw(run.blocks[i], cfg),
        dir=layout.local_block_dir(key),
        identity=identity,
        inputs=inputs,
        input_fingerprint=in_fp,
    )
    prior = resumable(
        None if restart else checkpoint.read_meta(b.dir),
        identity,
        where=str(b.dir),
        fix=f"rerun with `zg train local-block {key} --restart`, or restore the old params",
    )
    b.dir = loop.begin(b.dir, prior)  # a restart builds beside the old folder; train_block swaps it in
    if prior is None:
        b.save(0)
    else:
        b.curve, b.step = checkpoint.restore(b.dir, prior, b.block, b.opt, b.gen), prior["step"]
    return b


def _steps(b: BlockRun) -> loop.Steps:
    """A sequential block's part of the loop: the seeded batches (its input rows, the token ids as targets)."""
    run, blk, cfg, opt = b.run, b.block, b.cfg, b.opt
    dev = next(blk.parameters()).device

    def batches(start: int, end: int):
        for s in range(start, end):
            rows = step_rows(run.train_rows, s, cfg.batch_size, run.data_seed)
            y = run.ids[rows]
            yield s, (y if b.inputs is None else _take(b.inputs, rows), y, sha256_bytes(y.numpy().tobytes())[:16])

    def fail(step: int, what: str) -> ZgError:
        return loop.diverged(
            f"local block {b.key}",
            step,
            what,
            key=f"local.blocks.{b.key}.lr",
            fix="lower its lr and rerun with --restart",
        )

    def work(step: int, batch) -> int:
        x, y, digest = batch
        _, loss, terms = blk(x.to(dev), y.to(dev), mtp_weight=cfg.mtp_weight)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(blk.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise fail(step, f"loss became {value}")
        b.curve.append({"loss": value, **{k: float(v) for k, v in terms.items()}, "batch": digest})
        return y.numel()

    return loop.Steps(
        name=f"train local {b.key}",
        batches=batches,
        work=work,
        lrs=[(opt, lambda s: local_lr(cfg, s))],
        save=b.save,
        checkpoint_every=cfg.checkpoint_every,
        fail=fail,
    )


def train_block(
    project: ProjectConfig, key: str, *, stop_after: int | None = None, restart: bool = False, layout: Layout = Layout()
) -> LocalBlockResult:
    """Train block KEY to its steps from its input dataset (token ids for b00), then write its outputs."""
    _sequential(project)
    loop.check_stop_after(stop_after)
    with project_lock(layout, f"local-{key}", writes=layout.local_block_dir(key)):
        b = _setup(project, key, restart=restart, layout=layout)
        end = loop.end_step(b.cfg.steps, b.step, stop_after)
        b.block.train()
        loop.fit(b, end, _steps(b))
        sha = checkpoint.state_sha256(b.block, b.opt)
        result = LocalBlockResult(
            status="stopped",
            key=key,
            step=end,
            steps=b.cfg.steps,
            state_sha256=sha,
            tokens_sha256=sha256_bytes("".join(c["batch"] for c in b.curve).encode()),
        )
        if end < b.cfg.steps:
            b.save(end)
            loop.publish(b.dir, layout.local_block_dir(key))
            return result
        checkpoint.finish(b.dir, {**b.identity, "done": True, "state_sha256": sha}, b.block, b.opt, b.gen, b.curve, end)
        loop.publish(b.dir, layout.local_block_dir(key))
        _publish(b, sha, layout)
        result = replace(
            result,
            status="done",
            input_fingerprint=b.input_fingerprint,
            tokens_per_s=b.tokens_per_s(),
            train_loss=loop.mean_tail([c["loss"] for c in b.curve]),
        )
        write_metrics(layout.local_block_metrics(key), result.metrics())
        return result


def _publish(b: BlockRun, sha: str, layout: Layout) -> None:
    """The block's outputs over every token row, for the next block (the last block has no next)."""
    i, run = b.i, b.run
    if i == len(run.keys) - 1:
        return
    hi = run.identity["boundaries"][i + 1]
    lineage = {
        "block": b.key,
        "layer": hi,
        "state_sha256": sha,
        "input_fingerprint": b.input_fingerprint,
        "tokens_fingerprint": run.identity["tokens_fingerprint"],
        "seq_version": SEQ_VERSION,
    }
    lineage["fingerprint"] = sha256_bytes(canonical_json(lineage).encode())
    _write_outputs(
        layout.local_boundary(hi), b.block, run.ids, b.inputs, lineage, b.cfg.batch_size, run.model.config.hidden_size
    )


def export(project: ProjectConfig, *, layout: Layout = Layout()) -> LocalExportResult:
    """Every block's final weights into the model: models/local/hf and the held-out CE in metrics/local.json."""
    from safetensors.torch import load_file

    _sequential(project)
    with project_lock(layout, "local-export", writes=layout.local_hf):
        run = build(project, layout)
        shas, curves = {}, {}
        for key, blk in zip(run.keys, run.blocks):
            d = layout.local_block_dir(key)
            meta = checkpoint.read_meta(d)
            if meta is None or not meta.get("done"):
                raise ZgError(f"block {key} has not finished ({d / 'meta.json'})", fix=f"run `dvc repro local_{key}`")
            checkpoint.check_weights(d, meta)
            missing, unexpected = blk.load_state_dict(load_file(str(d / "model.safetensors")), strict=False)
            if unexpected or any(not m.startswith("rotary_emb.") for m in missing):
                raise ZgError(
                    f"{d / 'model.safetensors'} does not fit block {key} of this model",
                    fix=f"rerun `dvc repro local_{key}`",
                )
            shas[key] = meta["state_sha256"]
            c = checkpoint.checkpoint_dir(d, meta, fix=f"rerun `dvc repro local_{key}`")
            curves[key] = json.loads((c / "curve.json").read_text())
        with atomic_path(layout.local_hf) as tmp:
            run.model.save_pretrained(tmp)
            run.tokenizer.save_pretrained(tmp)
        scores = heldout_scores(
            layout.local_hf, run.blocks, run.keys, run.ids[run.heldout_rows], run.cfg.eval_batch_size
        )
        result = LocalExportResult(
            status="done",
            mode="sequential",
            k=len(run.keys),
            aux=run.cfg.aux,
            mtp=run.cfg.mtp,
            state_sha256=sha256_bytes("".join(shas[k] for k in run.keys).encode()),
            block_state_sha256=shas,
            tokens_sha256=sha256_bytes("".join(c["batch"] for c in curves[run.keys[0]]).encode()),
            **scores,
            train_loss={k: loop.mean_tail([c["loss"] for c in v]) for k, v in curves.items()},
            tokens_seen={
                k: len(v) * run.bcfgs[i].batch_size * int(run.ids.shape[1]) for i, (k, v) in enumerate(curves.items())
            },
            params=sum(p.numel() for p in run.model.parameters()),
        )
        write_metrics(layout.local_metrics, result.metrics())
        return result

"""Greedy local pretraining: throughput of the early_backward schedule against phased, and the
activations each block saves for backward against end-to-end training. Not a test; prints ratios.

    python bench/local_schedule.py --project DIR [--steps 20] [--repeats 3]
    ZG_DEVICE=cuda python bench/local_schedule.py --project DIR     # on a GPU box

DIR is a project made with `zg init DIR --profile local` (or local-tiny) that has run
`dvc repro tokens` (teacher and tokens present). The bench never writes to DIR: it copies the
teacher folder, the token set and params.yaml into a scratch directory and trains there, in this
process, with ``checkpoint_every: 0``. The two schedules alternate (A B A B ...) on the same seeded
batches; each timed run is the step loop alone (``fit``: no setup, no save, no evaluation), and
the first run of each schedule is a warm-up that is not counted. Both schedules give bitwise-equal
weights, which the bench also checks (state_sha256) before it prints a ratio.

Activation memory: bytes of the distinct tensor storages that autograd saves for backward in one
forward of each block of the project's partition (its own head and loss included), against the
same count for the whole model as one block (K=1, end to end) on the same batch.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml


def _scratch(project: Path, into: Path) -> Path:
    for rel in (
        "models/teacher/hf",
        "models/teacher/teacher.json",
        "data/tokens.lance",
        "data/tokens.json",
        "params.yaml",
    ):
        src, dst = project / rel, into / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    return into


def _project(root: Path, **local):
    from zgtrain.project.config import ProjectConfig

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["local"].update(local)
    if "boundaries" in local:
        params["partition"]["boundaries"] = params["local"].pop("boundaries")
        params.pop("blocks", None)  # derived from the partition; not needed to train
    return ProjectConfig.from_params(params)


def _timed(root: Path, schedule: str, steps: int) -> tuple[float, str]:
    from zgdata.layout import Layout
    from zgtrain.local.simultaneous import fit, setup, state_sha256

    run = setup(_project(root, schedule=schedule, steps=steps, checkpoint_every=0), restart=True, layout=Layout(root))
    if torch.cuda.is_available() and next(run.model.parameters()).is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fit(run, steps)  # syncs once per step (the losses it records)
    seconds = time.perf_counter() - t0
    return run.tokens / seconds, state_sha256(run)["state_sha256"]


def _saved_bytes(root: Path, boundaries: list[int] | None) -> list[int]:
    """Per block, bytes of distinct storages saved for backward by one forward on the first training batch."""
    from zgdata.layout import Layout
    from zgdata.store.reader import step_rows
    from zgtrain.local.simultaneous import setup

    over = {"checkpoint_every": 0, "steps": 1}
    if boundaries is not None:
        over["boundaries"] = boundaries
    run = setup(_project(root, **over), restart=True, layout=Layout(root))
    dev = next(run.model.parameters()).device
    batch = run.ids[step_rows(run.train_rows, 0, run.cfg.batch_size, run.data_seed)].to(dev)
    params = {p.untyped_storage().data_ptr() for b in run.blocks for p in b.parameters()}
    out, x = [], batch
    for blk in run.blocks:
        seen: dict[int, int] = {}

        def pack(t, seen=seen):  # this block's own record (bound now, not the loop's last)
            s = t.untyped_storage()
            if s.data_ptr() not in params:  # weights are not activations
                seen[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h, loss, _ = blk(x, batch, mtp_weight=run.cfg.mtp_weight)
        out.append(sum(seen.values()))
        x = h.detach()
        del loss
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-only", action="store_true", help="skip the timed runs (the memory count is exact)")
    args = ap.parse_args()
    from zgdata.core.runtime import device

    with tempfile.TemporaryDirectory(prefix="zg-local-bench-") as tmp:
        root = _scratch(args.project.resolve(), Path(tmp))
        params = yaml.safe_load((root / "params.yaml").read_text())
        print(f"device {device()}, partition {params['partition']['boundaries']}, model {params['local']}")
        if not args.memory_only:
            _throughput(root, args.steps, args.repeats)
        _memory(root, params)


def _throughput(root: Path, steps: int, repeats: int) -> None:
    rates: dict[str, list[float]] = {"phased": [], "early_backward": []}
    shas = set()
    for i in range(repeats + 1):
        for schedule in rates:
            rate, sha = _timed(root, schedule, steps)
            shas.add(sha)
            print(f"  run {i} {schedule:15s} {rate:10.1f} tokens/s" + ("  (warm-up, not counted)" if i == 0 else ""))
            if i:
                rates[schedule].append(rate)
    if len(shas) != 1:
        raise SystemExit(f"the schedules disagree: state_sha256 {sorted(shas)}")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"schedules bitwise equal (state_sha256 {shas.pop()[:12]})")
    print(
        f"throughput early_backward / phased = {med['early_backward'] / med['phased']:.3f} "
        f"(median of {repeats}: {med['early_backward']:.1f} / {med['phased']:.1f} tokens/s)"
    )


def _memory(root: Path, params: dict) -> None:
    per_block = _saved_bytes(root, None)
    whole = _saved_bytes(root, [0, params["local"]["layers"]])[0]
    for k, b in enumerate(per_block):
        print(f"  block b{k:02d}: {b / 2**20:9.2f} MiB saved for backward")
    print(
        f"activations saved for backward: end to end {whole / 2**20:.2f} MiB, largest block "
        f"{max(per_block) / 2**20:.2f} MiB -> {whole / max(per_block):.2f}x less per block"
    )


if __name__ == "__main__":
    main()

"""Benchmark one block of the default teacher: cached vs online step throughput, and block vs
full-teacher training memory at the same batch. Not a test; prints ratios measured in one run.

    python bench/train_block.py --project /path/to/project --key b02 --steps 6

The project must have run `dvc repro materialize` (teacher, tokens and boundaries present).
Peak memory is measured in separate subprocesses (ru_maxrss growth over the process's
baseline after loading), so each measurement has its own peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _throughput(project: Path, key: str, steps: int, targets: str) -> float:
    """Steps/s of `zg train block KEY` (in-process, fresh state) over `steps` steps."""
    import yaml

    from zgdata.layout import Layout
    from zgtrain.trainer import train_block

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["blocks"][key].update(steps=steps, checkpoint_every=0, heldout_rows=1)
    layout = Layout(project)
    t0 = time.perf_counter()
    train_block(params, key, targets=targets, restart=True, layout=layout)
    return steps / (time.perf_counter() - t0)


def _memory_child(project: Path, key: str, mode: str, batch: int) -> None:
    """Child process: report activation+grad memory of one fwd+bwd (block or full teacher)."""
    import numpy as np

    from zgdata.config import PartitionConfig, section
    from zgdata.layout import Layout
    from zgdata.reader import BoundaryPair
    from zgdata.teacher import load_teacher, load_slice
    from zgdata.tokens import read_tokens

    import yaml
    from transformers import LlamaConfig

    from zgtrain.conversions import convert
    from zgtrain.config import block_config

    layout = Layout(project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    rows = np.arange(batch)
    if mode == "block":
        spec = section(params, PartitionConfig, "partition").block(key)
        x, y = BoundaryPair(layout.boundary(spec.input), layout.boundary(spec.output)).take(rows)
        x, y = x.float(), y.float()
        tensors, meta = load_slice(layout.teacher_slice(key))
        model = convert("identity", tensors, LlamaConfig.from_dict(meta["config"]), block_config(params, key), x, None)
        base = _rss_mb()
        loss = (model(x) - y).pow(2).mean()
    else:
        model, _ = load_teacher(layout, with_tokenizer=False)
        model.train()
        ids, _ = read_tokens(layout, rows)
        base = _rss_mb()
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    print(json.dumps({"peak_growth_mb": _rss_mb() - base}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--key", default="b02")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--child", choices=["block", "full"])
    a = ap.parse_args()
    os.environ.setdefault("ZG_QUIET", "1")
    if a.child:
        return _memory_child(a.project.resolve(), a.key, a.child, a.batch)
    project = a.project.resolve()
    print(f"# {' '.join(sys.argv)}\n# torch {torch.__version__}, threads {torch.get_num_threads()}")
    rates = {"cached": [], "online": []}
    for _ in range(2):  # alternate to spread machine noise over both
        for t in ("cached", "online"):
            rates[t].append(_throughput(project, a.key, a.steps, t))
    best = {t: max(v) for t, v in rates.items()}
    print(f"steps/s cached {best['cached']:.3f}, online {best['online']:.3f}; "
          f"cached / online = {best['cached'] / best['online']:.2f}x")
    mem = {}
    for mode in ("block", "full"):
        out = subprocess.run([sys.executable, __file__, "--project", str(project), "--key", a.key, "--child", mode,
                              "--batch", str(a.batch)], capture_output=True, text=True, check=True).stdout
        mem[mode] = json.loads(out.strip().splitlines()[-1])["peak_growth_mb"]
    print(f"fwd+bwd peak memory growth at batch {a.batch}: block {a.key} {mem['block']:.0f} MB, full teacher "
          f"{mem['full']:.0f} MB; block / full = {mem['block'] / mem['full']:.3f} "
          f"({mem['full'] / mem['block']:.1f}x reduction)")


if __name__ == "__main__":
    main()

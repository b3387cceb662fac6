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
import sys
import time
from pathlib import Path

import torch
from harness import run


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _throughput(project: Path, key: str, steps: int, targets: str) -> tuple[float, float]:
    """Steps/s of `zg train block KEY` (in-process, fresh state) over `steps` steps: of the whole call,
    and of its step loop alone (the trainer's ``train.steps`` span: no setup, model load or evaluation)."""
    import yaml

    from zgdata.core.timing import collect
    from zgdata.layout import Layout
    from zgtrain.block.train import train_block
    from zgtrain.project.config import ProjectConfig

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["blocks"][key].update(steps=steps, checkpoint_every=0, heldout_rows=1)
    layout = Layout(project)
    with collect() as timings:
        t0 = time.perf_counter()
        train_block(ProjectConfig.from_params(params), key, targets=targets, restart=True, layout=layout)
        whole = time.perf_counter() - t0
    return steps / whole, steps / timings["train.steps"].seconds


class _RssPeak:
    """Peak resident memory while active, sampled from /proc every millisecond (torch allocations
    bypass Python's allocator, and ru_maxrss keeps the load-time peak)."""

    def __enter__(self):
        import threading

        self.base = self.peak = self._now()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        return self

    @staticmethod
    def _now() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self._now())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.peak = max(self.peak, self._now())


def _memory_child(project: Path, key: str, mode: str, batch: int) -> None:
    """Child process: memory of one fwd+bwd (block or full teacher) at the same batch.

    Reports the bytes of tensors autograd saves for backward (activation memory, exact,
    deduplicated by storage) and the peak RSS growth over the process's state just before.
    """
    import numpy as np
    import yaml

    from zgdata.config import PartitionConfig, section
    from zgdata.families.registry import config_from_dict
    from zgdata.layout import Layout
    from zgdata.store.reader import BoundaryPair
    from zgdata.teacher.prepare import load_slice, load_teacher
    from zgdata.tokens.store import read_tokens
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import ProjectConfig

    layout = Layout(project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    rows = np.arange(batch)
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t

    if mode == "block":
        spec = section(params, PartitionConfig, "partition").block(key)
        x, y = BoundaryPair(layout.boundary(spec.input), layout.boundary(spec.output)).take(rows)
        x, y = x.float(), y.float()
        tensors, meta = load_slice(layout.teacher_slice(key))
        model = convert(
            "identity",
            tensors,
            config_from_dict(meta["config"]),
            ProjectConfig.from_params(params).block(key).train,
            x,
            None,
        )
        run = lambda: (model(x) - y).pow(2).mean()  # noqa: E731
    else:
        model, _ = load_teacher(layout, with_tokenizer=False)
        model.train()
        ids, _ = read_tokens(layout, rows)
        run = lambda: model(input_ids=ids, labels=ids).loss  # noqa: E731
    with _RssPeak() as rss, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run().backward()
    print(json.dumps({"saved_mb": sum(saved.values()) / 2**20, "rss_growth_mb": rss.peak - rss.base}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--key", default="b02")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", dest="seq_len", type=int, default=512, help="label only: the project's seq_len")
    ap.add_argument("--child", choices=["block", "full"])
    ap.add_argument("--memory-only", action="store_true", help="skip the throughput comparison")
    a = ap.parse_args()
    os.environ.setdefault("ZG_QUIET", "1")
    if a.child:
        return _memory_child(a.project.resolve(), a.key, a.child, a.batch)
    project = a.project.resolve()
    print(f"# {' '.join(sys.argv)}\n# torch {torch.__version__}, threads {torch.get_num_threads()}")
    if not a.memory_only:
        rates = {"cached": [], "online": []}
        for _ in range(2):  # alternate to spread machine noise over both
            for t in ("cached", "online"):
                rates[t].append(_throughput(project, a.key, a.steps, t))
        best = {t: max(r[0] for r in v) for t, v in rates.items()}
        loop = {t: max(r[1] for r in v) for t, v in rates.items()}
        print(
            f"steps/s cached {best['cached']:.3f}, online {best['online']:.3f}; "
            f"cached / online = {best['cached'] / best['online']:.2f}x"
        )
        print(
            f"step loop only (train.steps span): steps/s cached {loop['cached']:.3f}, online "
            f"{loop['online']:.3f}; cached / online = {loop['cached'] / loop['online']:.2f}x"
        )
    mem = {}
    for mode in ("block", "full"):
        child = [sys.executable, __file__, "--project", project, "--key", a.key, "--child", mode, "--batch", a.batch]
        out = run(child).stdout
        mem[mode] = json.loads(out.strip().splitlines()[-1])
    b, f = mem["block"], mem["full"]
    print(
        f"fwd+bwd at batch {a.batch}x{a.seq_len}: activations saved for backward: block {a.key} "
        f"{b['saved_mb']:.0f} MB, full teacher {f['saved_mb']:.0f} MB; full / block = "
        f"{f['saved_mb'] / b['saved_mb']:.1f}x"
    )
    print(
        f"peak RSS growth during fwd+bwd: block {b['rss_growth_mb']:.0f} MB, full teacher "
        f"{f['rss_growth_mb']:.0f} MB; full / block = {f['rss_growth_mb'] / max(b['rss_growth_mb'], 1e-9):.1f}x"
    )


if __name__ == "__main__":
    main()

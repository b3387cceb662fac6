"""Benchmark: peak memory of `zg teacher prepare` on a mixture-of-experts teacher, against its weights' bytes. Not a
test; prints ratios measured side by side in one run.

    python bench/moe_memory.py                        # Mixtral-like, Qwen2-MoE-like and dense teachers, ~1.2 GB bf16 each
    python bench/moe_memory.py --gb 2.5 --kinds mixtral dense --no-materialize
    python bench/moe_memory.py --trace                # also the RSS of each step of prepare (load, hash, save, slices)

Each teacher is a random model of 4 layers built from its family's config (a Mixtral-like one with 48 experts, a
Qwen2-MoE-like one with 91 experts (at the default --gb) and a shared expert, a dense Llama), saved with save_pretrained in bfloat16 and
sharded like a released checkpoint (index + shards; transformers 5 writes experts per expert, as Mixtral's and
Qwen's checkpoints are, and fuses them into 3-D ``gate_up_proj`` / ``down_proj`` on load), with the byte-level
tokenizer, under ``--workdir`` (kept between runs). A tiny-profile project prepares it (``teacher.source``: that
directory, ``teacher.dtype: auto``, so it stays bf16). Each step runs as its own process and is measured by the
kernel (``ru_maxrss`` of that child, from wait4) and by sampling ``/proc/<pid>/status`` (the anonymous and the
file-backed part of the peak: mmapped safetensors pages count in RSS but are the page cache's, not the heap's):

  imports       python importing torch, transformers and zg's prepare module: the fixed cost under every step
  prepare       `zg teacher prepare` (load, hash, save hf/, record file digests, write block slices)
  load          ``load_teacher(per_layer=True)`` of the prepared teacher, as materialize's capture loads it
  materialize   `zg data materialize` over the tiny corpus (48 sequences of 64 tokens), after `zg data tokenize`

Printed per step: the peak, peak / weights, and (peak - imports) / weights, the part that grows with the model (a
93 GB teacher pays the imports once). The last line is one JSON object with every figure. Default run: a few
minutes on 2 cores, about 4 GB of disk per teacher.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness import BIN, environ, params, scaffold

KINDS = ("mixtral", "qwen2_moe", "dense")
GB = 1e9
IMPORTS = "import torch, transformers, zgtrain.cli, zgdata.teacher.prepare, zgdata.materialize.writer"


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# the teachers


def config(kind: str, gb: float):
    """A 4-layer config of ``kind`` whose bf16 weights are about ``gb`` GB (experts or MLP width scale with it)."""
    from zgdata.families.registry import family
    from zgdata.teacher.tokenizer import byte_level_tokenizer

    tok, c = byte_level_tokenizer(), 1024
    per_layer = gb * GB / 2 / 4  # parameters per layer
    attn = {"hidden_size": c, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 4}
    if kind == "mixtral":  # experts of width I = C, like Mixtral-8x7B's 14336 / 4096 = 3.5 (narrower here)
        fields = {**attn, "intermediate_size": c, "num_local_experts": max(2, round(per_layer / (3 * c * c)))}
        fields["num_experts_per_tok"] = 2
    elif kind == "qwen2_moe":  # many narrow experts and a shared one, like Qwen1.5-MoE-A2.7B (60 x 1408, shared 5632)
        shared = 4 * 512
        experts = round((per_layer - 3 * c * shared) / (3 * c * 512))
        fields = {**attn, "moe_intermediate_size": 512, "shared_expert_intermediate_size": shared}
        fields |= {"num_experts": max(2, experts), "num_experts_per_tok": 4}
    else:  # dense Llama: the MLP takes what the experts take above
        fields = {**attn, "intermediate_size": round(per_layer / (3 * c) / 256) * 256}
    fam = family("llama" if kind == "dense" else kind)
    cfg = fam.tiny_config(tok)
    for k, v in fields.items():
        setattr(cfg, k, v)
    cfg.head_dim = c // cfg.num_attention_heads
    return cfg, tok


def build(kind: str, gb: float, out: Path) -> None:
    """Save a random ``kind`` teacher of about ``gb`` GB (bf16, sharded) with its tokenizer in ``out`` (run in a child)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg, tok = config(kind, gb)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, max_shard_size="500MB")
    tok.save_pretrained(tmp)
    os.replace(tmp, out)


def weight_bytes(path: Path) -> int:
    """The bytes of every tensor in ``path``'s safetensors files (from their headers)."""
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


# ---------------------------------------------------------------------------------------------
# measuring a child


def _status(pid: int) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def measured(cmd: list, cwd: Path | None = None, *, env: dict | None = None) -> dict:
    """Run CMD; its peak RSS (wait4's ru_maxrss), the peaks of its sampled anonymous and file-backed RSS, wall time."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [str(c) for c in cmd], cwd=cwd, env=env or environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for k, v in _status(p.pid).items():
                if k in peaks:
                    peaks[k] = max(peaks[k], v)
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = p.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    done.set()
    sampler.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.exit(f"{' '.join(map(str, cmd))} failed (exit {p.returncode}):\n{output[-3000:]}")
    return {
        "peak": usage.ru_maxrss * 1024,
        "anon": peaks["RssAnon"],
        "file": peaks["RssFile"],
        "wall_s": time.perf_counter() - t0,
        "output": output,
    }


# ---------------------------------------------------------------------------------------------
# --trace: RSS across prepare's steps, in one process


TRACED = ("_resolve", "self_check", "tensors_sha256", "record_files", "write_slices", "_save_file")


def trace(root: Path) -> None:
    """Run `zg teacher prepare` in this process with each step of zgdata.teacher.prepare wrapped: print the RSS on
    entry, on exit and the peak within it (a thread samples /proc/self/status every 5 ms)."""
    import functools

    from transformers import PreTrainedModel

    import zgdata.teacher.prepare as prep

    os.chdir(root)
    state = {"peak": 0, "anon": 0}

    def sample():
        while True:
            st = _status(os.getpid())
            state["peak"], state["anon"] = (
                max(state["peak"], st.get("VmRSS", 0)),
                max(state["anon"], st.get("RssAnon", 0)),
            )
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()

    def wrap(name, fn):
        @functools.wraps(fn)
        def traced(*a, **kw):
            st = _status(os.getpid())
            before = st.get("VmRSS", 0)
            outer, outer_anon, state["peak"], state["anon"] = state["peak"], state["anon"], before, st.get("RssAnon", 0)
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                now = _status(os.getpid()).get("VmRSS", 0)
                peak, anon = max(state["peak"], now), state["anon"]
                log(
                    f"  trace {name:<18} rss {before / GB:6.2f} -> {now / GB:6.2f} GB, peak {peak / GB:6.2f} GB "
                    f"(anon {anon / GB:5.2f}), {time.perf_counter() - t:5.1f} s"
                )
                state["peak"], state["anon"] = max(outer, peak), max(outer_anon, anon)

        return traced

    for name in TRACED:
        if hasattr(prep, name):
            setattr(prep, name, wrap(name, getattr(prep, name)))
    PreTrainedModel.save_pretrained = wrap("save_pretrained", PreTrainedModel.save_pretrained)
    from zgtrain.cli import main

    sys.argv = ["zg", "teacher", "prepare"]
    main()
    log(f"  trace total peak {state['peak'] / GB:.2f} GB (anon {state['anon'] / GB:.2f})")


# ---------------------------------------------------------------------------------------------


def one(kind: str, args, imports: int) -> dict:
    src = args.workdir / f"{kind}-{args.gb:g}gb"
    if not src.exists():
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--build", kind, "--gb", str(args.gb), "--workdir", str(args.workdir)],
            check=True,
            env=environ(),
        )
        log(f"{kind}: built {src} in {time.perf_counter() - t:.0f} s")
    weights = weight_bytes(src)
    root = args.workdir / f"project-{kind}"
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    scaffold(root, "tiny", message=None)

    def edit(p):
        p["teacher"] |= {"source": str(src), "dtype": "auto"}

    params(root, edit)
    row = {"kind": kind, "weights_gb": weights / GB}
    steps = {"prepare": [BIN / "zg", "teacher", "prepare"]}
    load = "from zgdata.teacher.prepare import load_teacher; from zgdata.layout import Layout; from pathlib import Path; load_teacher(Layout(Path('.')), dtype='float32', with_tokenizer=False, per_layer=True)"
    steps["load"] = [sys.executable, "-c", load]
    for name, cmd in steps.items():
        r = measured(cmd, root)
        row[name] = r
    if args.materialize:
        subprocess.run([BIN / "zg", "data", "tokenize"], cwd=root, check=True, env=environ(), capture_output=True)
        row["materialize"] = measured([BIN / "zg", "data", "materialize"], root)
    if args.trace:
        subprocess.run(["rm", "-rf", str(root / "models" / "teacher")], check=True)
        subprocess.run([sys.executable, __file__, "--trace-project", str(root)], check=True, env=environ())
    for name in ("prepare", "load", "materialize"):
        if name in row:
            r = row.pop(name)
            row[f"{name}_peak_gb"] = r["peak"] / GB
            row[f"{name}_anon_gb"] = r["anon"] / GB
            row[f"{name}_file_gb"] = r["file"] / GB
            row[f"{name}_wall_s"] = round(r["wall_s"], 1)
            row[f"{name}_peak_over_weights"] = round(r["peak"] / weights, 3)
            row[f"{name}_net_over_weights"] = round((r["peak"] - imports) / weights, 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zgbench-moe-memory"))
    ap.add_argument("--gb", type=float, default=1.2, help="bf16 weights of each teacher, GB (default 1.2)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--no-materialize", dest="materialize", action="store_false")
    ap.add_argument("--trace", action="store_true", help="also RSS per step of prepare (in one traced process)")
    ap.add_argument("--build", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--trace-project", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        return build(args.build, args.gb, args.workdir / f"{args.build}-{args.gb:g}gb")
    if args.trace_project:
        return trace(args.trace_project)
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    imports = measured([sys.executable, "-c", IMPORTS])["peak"]
    log(f"imports: {imports / GB:.2f} GB peak RSS (importing torch, transformers, zg's CLI, prepare and materialize)")
    rows = []
    for kind in args.kinds:
        row = one(kind, args, imports)
        rows.append(row)
        for step in ("prepare", "load", "materialize"):
            if f"{step}_peak_gb" in row:
                log(
                    f"{kind:>9} {row['weights_gb']:.2f} GB weights  {step:<11} peak {row[f'{step}_peak_gb']:5.2f} GB "
                    f"(anon {row[f'{step}_anon_gb']:5.2f}, file {row[f'{step}_file_gb']:5.2f})  "
                    f"x{row[f'{step}_peak_over_weights']:.2f} of weights, net x{row[f'{step}_net_over_weights']:.2f}  "
                    f"{row[f'{step}_wall_s']:.0f} s"
                )
    summary = {"imports_gb": round(imports / GB, 3), "gb": args.gb, "teachers": rows}
    for step in ("prepare", "load", "materialize"):
        moe = [r[f"{step}_peak_over_weights"] for r in rows if r["kind"] != "dense" and f"{step}_peak_gb" in r]
        if moe:
            summary[f"{step}_peak_over_weights"] = max(moe)
            summary[f"{step}_net_over_weights"] = max(
                r[f"{step}_net_over_weights"] for r in rows if r["kind"] != "dense" and f"{step}_peak_gb" in r
            )
        dense = [r for r in rows if r["kind"] == "dense" and f"{step}_peak_gb" in r]
        if dense:
            summary[f"dense_{step}_peak_over_weights"] = dense[0][f"{step}_peak_over_weights"]
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()

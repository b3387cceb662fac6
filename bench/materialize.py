"""Benchmark: materialize vs teacher-forward-only, on-disk size, boundary-pair loader vs np.memmap.

Not a test. One run measures, side by side on the same batches (these machines are
noisy, so compare the ratios, not the absolute figures):

  1. teacher-forward-only throughput (tokens/s): the prepared teacher, loaded as
     materialize loads it, runs ``capture`` over every token row in materialize's
     batch size; nothing is written.
  2. ``materialize(...)`` end to end (tokens/s); data/boundaries and data/.staging
     are deleted before each run. (1) and (2) alternate ``--repeats`` times each
     (order F M, M F, ...); best, median and per-pair ratios are printed, with a
     section breakdown of materialize from its ``zgdata.core.timing`` spans.
  3. bytes on disk per token per boundary / (hidden x 2).
  4. ``BoundaryPair.batches`` over the train batches (batch 4, at least --loader-steps
     of them, whole seeded epochs), bytes/s, against reading the same rows of the same
     bytes from an ``np.memmap`` of a raw .npy; plus diagnostics (no prefetch thread,
     rows sorted per batch, memmap straight onto the Lance pages).

Each timed run records the share of the CPUs that other processes used meanwhile
("foreign CPU"); before each run the script waits (up to --quiet-timeout) for a quiet
machine. On a 2-core box shared with other CPU-bound work, torch's 2-thread OpenMP
team can run several times slower, so trust pairs with similar foreign shares.

Usage:
  python bench/materialize.py                              # smollm2, 24 train + 4 heldout seqs of 512
  python bench/materialize.py --profile tiny               # quick smoke run (random tiny teacher)
  python bench/materialize.py --workdir /tmp/zgbench       # reuse a prepared teacher / tokens there
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("ZG_QUIET", "1")  # no progress bars in the log (see --progress)

import numpy as np
import torch
from harness import CpuMeter, wait_quiet

from zgdata.config import CorpusConfig, MaterializeConfig, PartitionConfig, TeacherConfig, section
from zgdata.core.timing import collect
from zgdata.families.capture import capture
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.store.lance_io import dir_bytes, open_dataset
from zgdata.store.reader import BoundaryDataset, BoundaryPair
from zgdata.teacher.prepare import load_teacher, prepare, read_teacher_json
from zgdata.tokens.store import read_tokens, tokens_meta
from zgdata.tokens.tokenset import tokenize
from zgtrain.pipeline.profiles import profile_params


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# project setup


def setup_project(root: Path, params: dict, *, force: bool) -> dict:
    layout = Layout(root=root)
    tcfg = section(params, TeacherConfig, "teacher")
    ccfg = section(params, CorpusConfig, "corpus")
    part = section(params, PartitionConfig, "partition")
    timings = {}
    have = layout.teacher_json.exists() and (layout.teacher_hf / "config.json").exists()
    if have and not force:
        tj = read_teacher_json(layout)
        have = (
            tj.get("source") == tcfg.source
            and tj.get("dtype") == tcfg.dtype
            and tj["architecture"]["num_layers"] >= part.boundaries[-1]
            and "files" in tj
        )  # files: identity digests
    if not have or force:
        log(f"preparing teacher {tcfg.source} in {layout.teacher_dir} ...")
        t = time.perf_counter()
        prepare(tcfg, part, layout=layout)
        timings["prepare_s"] = time.perf_counter() - t
    else:
        log(f"reusing prepared teacher in {layout.teacher_dir}")
    have_tok = layout.tokens_json.exists() and layout.tokens.exists() and not force and "prepare_s" not in timings
    if have_tok:
        lin = json.loads(layout.tokens_json.read_text())["lineage"]
        sp = lin["split"]
        have_tok = (
            lin["seq_len"] == ccfg.seq_len
            and sp["max_train_seqs"] == ccfg.max_train_seqs
            and sp["max_heldout_seqs"] == ccfg.max_heldout_seqs
            and sp["heldout"] == sorted(ccfg.heldout)
            and sp["documents"] == sorted(ccfg.documents)
            and sp["seed"] == ccfg.seed
            and lin["tokenizer_sha256"] == read_teacher_json(layout)["tokenizer_sha256"]
        )
    if not have_tok:
        log("tokenizing corpus ...")
        t = time.perf_counter()
        tokenize(ccfg, layout=layout)
        timings["tokenize_s"] = time.perf_counter() - t
    else:
        log(f"reusing {layout.tokens}")
    return timings


def clear_outputs(layout: Layout) -> None:
    shutil.rmtree(layout.boundaries_dir, ignore_errors=True)
    shutil.rmtree(layout.staging, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# 1. teacher forward only


def forward_only(layout: Layout, mcfg: MaterializeConfig, part: PartitionConfig, *, on_device: bool = False) -> dict:
    """Exactly materialize's compute (token reads + capture, same batches), no writes. ``on_device``: the
    boundaries stay on the teacher's device (each batch's forward still waited for): the forward without its copies
    to the host, which materialize overlaps with the next forward on a GPU (zgdata/core/host_copy.py)."""
    t0 = time.perf_counter()
    model, _ = load_teacher(layout, dtype=mcfg.compute_dtype, with_tokenizer=False)
    t_load = time.perf_counter() - t0
    storage = getattr(torch, mcfg.storage_dtype)
    ds = open_dataset(layout.tokens, kind="tokens")
    n_rows = ds.count_rows()
    seq_len = tokens_meta(layout)["lineage"]["seq_len"]
    read_s = 0.0
    sink = 0.0
    per_batch = []
    with CpuMeter() as meter:
        for lo in range(0, n_rows, mcfg.batch_size):
            rows = np.arange(lo, min(lo + mcfg.batch_size, n_rows))
            tr = time.perf_counter()
            ids, _ = read_tokens(layout, rows, ds=ds)
            read_s += time.perf_counter() - tr
            tc = time.perf_counter()
            caps = capture(model, ids, part.boundaries, storage_dtype=storage, on_device=on_device)
            sink += float(caps[part.boundaries[-1]][0, 0, 0])  # keep the result alive / observable (waits for it)
            per_batch.append(time.perf_counter() - tc)
    loop_s = meter.wall
    tokens = n_rows * seq_len
    del model
    return {
        "tokens": tokens,
        "load_s": t_load,
        "loop_s": loop_s,
        "read_tokens_s": read_s,
        "total_s": t_load + loop_s,
        "tok_s": tokens / loop_s,
        "tok_s_incl_load": tokens / (t_load + loop_s),
        "foreign": meter.foreign,
        "own_util": meter.own_util,
        "per_batch": per_batch,
    }


# ---------------------------------------------------------------------------------------------
# 2. materialize end to end (with a section breakdown from zgdata.core.timing spans)

# printed section label -> the span materialize marks it with (zgdata/materialize/driver.py)
SECTIONS = {
    "load_teacher": "materialize.load_teacher",
    "read_tokens": "materialize.read_tokens",
    "capture": "materialize.capture",
    "to_host": "materialize.to_host",
    "writer_flush(bg)": "materialize.commit",
    "finalize": "materialize.finalize",
}


def run_materialize(layout: Layout, mcfg: MaterializeConfig, part: PartitionConfig) -> dict:
    clear_outputs(layout)
    with collect(samples=True) as timings, CpuMeter() as meter:
        res = materialize(mcfg, part, layout=layout)
    t_end = time.perf_counter()
    wall = meter.wall
    assert not res.skipped, "materialize skipped: outputs were not cleared"
    out = {
        "tokens": res.tokens,
        "wall_s": wall,
        "seconds": res.seconds,
        "tok_s": res.tokens / wall,
        "foreign": meter.foreign,
        "own_util": meter.own_util,
    }
    s = {}
    for label, name in SECTIONS.items():
        st = timings[name]
        if st.count:
            s[label] = st.seconds
        if label == "writer_flush(bg)" and st.count:
            s["writer_flushes"] = float(st.count)
    cap = timings["materialize.capture"]
    if cap.count:
        s["after_last_capture(tail)"] = t_end - cap.last_end
    out["sections"] = s
    out["per_batch"] = cap.samples
    return out


# ---------------------------------------------------------------------------------------------
# 3. bytes on disk


def disk_figures(layout: Layout, part: PartitionConfig) -> dict:
    tj = read_teacher_json(layout)
    hidden = tj["architecture"]["hidden_size"]
    out = {}
    for n in part.names:
        p = layout.boundary(n)
        ds = open_dataset(p, kind="boundary")
        rows = ds.count_rows()
        seq_len = BoundaryDataset(p).seq_len
        b = dir_bytes(p)
        data_b = sum(f.stat().st_size for f in (p / "data").rglob("*") if f.is_file()) if (p / "data").exists() else b
        tok = rows * seq_len
        out[n] = {
            "bytes": b,
            "data_bytes": data_b,
            "tokens": tok,
            "per_tok": b / tok,
            "ratio": b / tok / (hidden * 2),
            "data_ratio": data_b / tok / (hidden * 2),
            "fragments": len(ds.get_fragments()),
            "versions": len(ds.versions()),
        }
    return out


# ---------------------------------------------------------------------------------------------
# 4. loader vs memmap


def _page_maps(side) -> callable | None:
    """Diagnostic only: np.memmap views straight onto the Lance pages of the ``hidden`` column.

    A bf16 boundary is stored uncompressed (flat 16-bit values, one fixed-size list per row),
    so each page buffer is just rows of raw bytes. Returns rows -> (N, T, C) uint16 copy, or
    None if the layout is not that (then the figure is skipped).
    """
    try:
        from lance.file import LanceFileReader

        t, c = json.loads(side.field.metadata[b"zg.shape"])
        row_bytes = t * c * 2
        col = [f.name for f in side.ds.schema].index("hidden")
        maps, starts, n = [], [], 0
        for frag in side.ds.get_fragments():
            files = frag.data_files()
            if len(files) != 1:
                return None
            path = str(side.path / "data" / files[0].path)
            md = LanceFileReader(path).metadata()
            for page in md.columns[col].pages:
                if len(page.buffers) != 1 or page.buffers[0].size % row_bytes:
                    return None
                k = page.buffers[0].size // row_bytes
                maps.append(
                    np.memmap(path, dtype=np.uint16, mode="r", offset=page.buffers[0].position, shape=(k, t, c))
                )
                starts.append(n)
                n += k
        if n != len(side.seq_ids):
            return None
        starts = np.asarray(starts)

        def read(rows):
            rows = np.asarray(rows)
            out = np.empty((len(rows), t, c), np.uint16)
            page = np.searchsorted(starts, rows, side="right") - 1
            for i, (r, pg) in enumerate(zip(rows, page)):
                out[i] = maps[pg][r - starts[pg]]
            return out

        probe = np.arange(min(n, 3))[::-1]
        if not np.array_equal(read(probe), side.take(probe).view(torch.int16).numpy().view(np.uint16)):
            return None
        return read
    except Exception:  # a diagnostic: never fail the benchmark over it
        return None


def loader_vs_memmap(
    layout: Layout,
    part: PartitionConfig,
    scratch: Path,
    *,
    batch_size: int,
    min_steps: int,
    repeats: int,
    quiet: float,
    quiet_timeout: float,
) -> dict:
    a, b = part.names[0], part.names[1]
    pair = BoundaryPair(layout.boundary(a), layout.boundary(b))
    n_train = len(pair.rows("train"))
    epoch_steps = -(-n_train // batch_size)
    steps = max(epoch_steps, min_steps)  # whole epochs' worth of seeded batches; more steps, steadier timing
    batch_rows = [pair.batch_rows("train", s, batch_size, 0) for s in range(steps)]

    # the same bytes, raw: one (N, T, C) uint16 .npy per side
    paths = []
    for name, side in (("x", pair.input), ("y", pair.output)):
        full = side.take(np.arange(len(side.seq_ids)))
        p = scratch / f"memmap_{name}.npy"
        arr = np.lib.format.open_memmap(p, mode="w+", dtype=np.uint16, shape=tuple(full.shape))
        arr[:] = full.view(torch.int16).numpy().view(np.uint16)
        arr.flush()
        del arr, full
        paths.append(p)

    def run_loader():
        nbytes, got = 0, []
        with CpuMeter() as m:
            for _step, rows, x, y in pair.batches("train", start_step=0, steps=steps, batch_size=batch_size, seed=0):
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
                got.append(rows)
        assert len(got) == steps and all(np.array_equal(g, r) for g, r in zip(got, batch_rows))
        return nbytes, m

    def run_loader_recheck():  # checksums on every read, as on a first epoch (the default checks a row once)
        p2 = BoundaryPair(layout.boundary(a), layout.boundary(b))
        p2.input.recheck = p2.output.recheck = True
        nbytes = 0
        with CpuMeter() as m:
            for _step, _rows, x, y in p2.batches("train", start_step=0, steps=steps, batch_size=batch_size, seed=0):
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        return nbytes, m

    def run_fresh(cache_mb):  # a new pair per pass: every row read for the first time (a first epoch)
        def run():
            old = os.environ.get("ZG_DECODED_CACHE_MB")
            if cache_mb is not None:
                os.environ["ZG_DECODED_CACHE_MB"] = str(cache_mb)
            try:
                p2 = BoundaryPair(layout.boundary(a), layout.boundary(b))
                nbytes = 0
                with CpuMeter() as m:
                    for _step, _rows, x, y in p2.batches(
                        "train", start_step=0, steps=steps, batch_size=batch_size, seed=0
                    ):
                        nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
                return nbytes, m
            finally:
                if cache_mb is not None:
                    os.environ.pop("ZG_DECODED_CACHE_MB", None) if old is None else os.environ.__setitem__(
                        "ZG_DECODED_CACHE_MB", old
                    )

        return run

    def run_take_sync():  # the loader's own read path without its prefetch thread
        nbytes = 0
        with CpuMeter() as m:
            for rows in batch_rows:
                x, y = pair.take(rows)
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        return nbytes, m

    def run_take_sorted():  # diagnostic: the same take with each batch's rows sorted
        nbytes = 0
        with CpuMeter() as m:
            for rows in batch_rows:
                x, y = pair.take(np.sort(rows))
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        return nbytes, m

    px, py = _page_maps(pair.input), _page_maps(pair.output)

    def run_pages():  # diagnostic: memmap straight onto the Lance data files' pages
        nbytes = 0
        with CpuMeter() as m:
            for rows in batch_rows:
                x = torch.from_numpy(px(rows)).view(torch.bfloat16)
                y = torch.from_numpy(py(rows)).view(torch.bfloat16)
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        return nbytes, m

    def run_memmap():
        mx = np.load(paths[0], mmap_mode="r")
        my = np.load(paths[1], mmap_mode="r")
        nbytes = 0
        with CpuMeter() as m:
            for rows in batch_rows:
                x = torch.from_numpy(mx[rows]).view(torch.bfloat16)  # fancy index: a copy out of the map
                y = torch.from_numpy(my[rows]).view(torch.bfloat16)
                nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        return nbytes, m

    # correctness: same bytes on one batch
    x0, _ = pair.take(batch_rows[0])
    mx = np.load(paths[0], mmap_mode="r")
    assert torch.equal(x0.view(torch.int16), torch.from_numpy(mx[batch_rows[0]].view(np.int16))), "memmap copy differs"
    del mx, x0

    runs = [
        ("loader_Bps", run_loader),
        ("fresh_Bps", run_fresh(None)),
        ("nocache_Bps", run_fresh(0)),
        ("recheck_Bps", run_loader_recheck),
        ("take_Bps", run_take_sync),
        ("sorted_Bps", run_take_sorted),
        ("memmap_Bps", run_memmap),
    ] + ([("pages_Bps", run_pages)] if px and py else [])
    for _, fn in runs:  # warm the page cache / first-open costs
        fn()
    out = {k: [] for k, _ in runs}
    out["foreign"] = []
    for _ in range(repeats):
        if quiet > 0:
            wait_quiet(quiet, quiet_timeout)
        for key, fn in runs:
            nb, m = fn()
            out[key].append(nb / m.wall)
            out["foreign"].append(m.foreign)
    for p in paths:
        p.unlink()
    return {
        "pair": f"{a}->{b}",
        "steps": steps,
        "epoch_steps": epoch_steps,
        "batch_size": batch_size,
        "bytes_per_pass": nb,
        **out,
    }


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--train-seqs", type=int, default=None, help="corpus.max_train_seqs (default 24; tiny: 48)")
    ap.add_argument("--heldout-seqs", type=int, default=None, help="corpus.max_heldout_seqs (default 4; tiny: 8)")
    ap.add_argument("--workdir", type=Path, default=None, help="project dir to (re)use; default a temp dir")
    ap.add_argument("--keep", action="store_true", help="keep the temp project dir")
    ap.add_argument("--force-prepare", action="store_true", help="re-prepare teacher and tokens even if present")
    ap.add_argument("--repeats", type=int, default=2, help="alternating forward/materialize runs each (>= 2)")
    ap.add_argument("--loader-repeats", type=int, default=3)
    ap.add_argument("--loader-batch", type=int, default=4)
    ap.add_argument("--loader-steps", type=int, default=60, help="at least this many loader batches per timed pass")
    ap.add_argument("--batch-size", type=int, default=None, help="override materialize.batch_size")
    ap.add_argument("--commit-rows", type=int, default=None, help="override materialize.commit_rows")
    ap.add_argument("--codec", default=None, choices=["raw", "zstd"], help="override materialize.codec")
    ap.add_argument(
        "--loader-only",
        action="store_true",
        help="only the loader vs memmap figures, on the boundaries already in --workdir",
    )
    ap.add_argument(
        "--quiet",
        type=float,
        default=0.15,
        help="before each timed run, wait until other processes use < this share of the CPUs (0 = don't)",
    )
    ap.add_argument("--quiet-timeout", type=float, default=90.0, help="longest wait for a quiet machine, seconds")
    ap.add_argument("--progress", action="store_true", help="show materialize's progress bar (ZG_QUIET=0)")
    args = ap.parse_args(argv)
    if args.progress:
        os.environ["ZG_QUIET"] = "0"
    try:  # transformers' "Loading weights" bars would clutter the log
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass

    params = profile_params(args.profile)
    if args.profile == "smollm2":
        params["corpus"]["max_train_seqs"] = args.train_seqs if args.train_seqs is not None else 24
        params["corpus"]["max_heldout_seqs"] = args.heldout_seqs if args.heldout_seqs is not None else 4
    else:
        if args.train_seqs is not None:
            params["corpus"]["max_train_seqs"] = args.train_seqs
        if args.heldout_seqs is not None:
            params["corpus"]["max_heldout_seqs"] = args.heldout_seqs
    if args.batch_size is not None:
        params["materialize"]["batch_size"] = args.batch_size
    if args.commit_rows is not None:
        params["materialize"]["commit_rows"] = args.commit_rows
    if args.codec is not None:
        params["materialize"]["codec"] = args.codec
    mcfg = section(params, MaterializeConfig, "materialize")
    part = section(params, PartitionConfig, "partition")

    tmp = None
    if args.workdir is None:
        tmp = Path(tempfile.mkdtemp(prefix="zgbench-"))
        root = tmp
    else:
        root = args.workdir.resolve()
        root.mkdir(parents=True, exist_ok=True)
    layout = Layout(root=root)

    cmd = "python " + " ".join(
        shlex.quote(a) for a in [str(Path(sys.argv[0]))] + (argv if argv is not None else sys.argv[1:])
    )
    log("=" * 78)
    log(f"command      : {cmd}")
    log(
        f"host         : {platform.node()}  {platform.machine()}  cpus={os.cpu_count()}  "
        f"loadavg(start)={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    log(
        f"python/torch : {platform.python_version()} / torch {torch.__version__}  "
        f"num_threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()}"
    )
    try:
        import lance
        import pyarrow
        import transformers

        log(
            f"libs         : pylance {lance.__version__}  pyarrow {pyarrow.__version__}  "
            f"transformers {transformers.__version__}  numpy {np.__version__}"
        )
    except Exception:  # informational only
        pass
    log(f"project      : {root}  profile={args.profile}")
    log(
        f"corpus       : seq_len={params['corpus']['seq_len']} max_train_seqs={params['corpus']['max_train_seqs']} "
        f"max_heldout_seqs={params['corpus']['max_heldout_seqs']}"
    )
    log(f"materialize  : {mcfg}")
    log(f"partition    : {part.boundaries}")
    log("=" * 78)

    def measure_loader() -> dict:  # 4. loader vs memmap: alone (--loader-only) or after the materialize runs
        return loader_vs_memmap(
            layout,
            part,
            root,
            batch_size=args.loader_batch,
            min_steps=args.loader_steps,
            repeats=args.loader_repeats,
            quiet=args.quiet,
            quiet_timeout=args.quiet_timeout,
        )

    if args.loader_only:
        loader = measure_loader()
        codec = BoundaryDataset(layout.boundary(part.names[0])).codec
        mm_b, mm_m = max(loader["memmap_Bps"]), statistics.median(loader["memmap_Bps"])
        log(f"loader only, codec {codec}, pair {loader['pair']}, {loader['steps']} batches of {loader['batch_size']}")
        for key, label in (
            ("loader_Bps", "loader batches() (checksum on first read)"),
            ("fresh_Bps", "loader batches(), fresh pair (first epoch)"),
            ("nocache_Bps", "fresh pair, ZG_DECODED_CACHE_MB=0 (before)"),
            ("recheck_Bps", "loader batches(), checksum every read"),
            ("take_Bps", "loader read path, no prefetch thread"),
            ("memmap_Bps", "np.memmap same rows"),
        ):
            b, m = max(loader[key]), statistics.median(loader[key])
            log(
                f"  {label:<44} best {b / 1e6:8.1f} MB/s  median {m / 1e6:8.1f} MB/s  ratio to memmap "
                f"best {b / mm_b:.3f} median {m / mm_m:.3f}"
            )
        log(f"  foreign CPU share: {[round(x, 2) for x in loader['foreign']]}")
        return 0
    try:
        setup = setup_project(root, params, force=args.force_prepare)
        tmeta = tokens_meta(layout)
        rows = tmeta["rows"]
        hidden = read_teacher_json(layout)["architecture"]["hidden_size"]
        n_tok = sum(rows.values()) * tmeta["lineage"]["seq_len"]
        log(
            f"tokens       : rows={rows} tokens={n_tok} hidden={hidden} "
            f"batches={-(-sum(rows.values()) // mcfg.batch_size)} of {mcfg.batch_size}"
        )
        for k, v in setup.items():
            log(f"setup        : {k} = {v:.1f}")

        # 1 + 2, alternating
        fwd, mat = [], []

        def do_fwd(i):
            q = wait_quiet(args.quiet, args.quiet_timeout) if args.quiet > 0 else float("nan")
            f = forward_only(layout, mcfg, part)
            fwd.append(f)
            log(
                f"[{i}] forward-only : {f['tok_s']:8.1f} tok/s  loop {f['loop_s']:6.2f}s  "
                f"(load {f['load_s']:.2f}s, token reads {f['read_tokens_s']:.3f}s; "
                f"incl. load {f['tok_s_incl_load']:.1f} tok/s)  foreign CPU {f['foreign']:.0%} "
                f"(before {q:.0%}), own {f['own_util']:.0%}"
            )

        def do_mat(i):
            q = wait_quiet(args.quiet, args.quiet_timeout) if args.quiet > 0 else float("nan")
            m = run_materialize(layout, mcfg, part)
            mat.append(m)
            sec = "  ".join(f"{k}={v:.2f}" for k, v in m["sections"].items())
            log(
                f"[{i}] materialize  : {m['tok_s']:8.1f} tok/s  wall {m['wall_s']:6.2f}s  "
                f"foreign CPU {m['foreign']:.0%} (before {q:.0%}), own {m['own_util']:.0%}"
            )
            log(f"      sections   : {sec}")

        for i in range(max(args.repeats, 1)):  # alternate the order too: F M, M F, F M, ...
            for step in (do_fwd, do_mat) if i % 2 == 0 else (do_mat, do_fwd):
                step(i)
            log(f"[{i}] ratio materialize / forward-only (this pair): {mat[-1]['tok_s'] / fwd[-1]['tok_s']:.3f}")

        disk = disk_figures(layout, part)
        loader = measure_loader()

        f_best = max(x["tok_s"] for x in fwd)
        f_med = statistics.median(x["tok_s"] for x in fwd)
        fl_best = max(x["tok_s_incl_load"] for x in fwd)
        m_best = max(x["tok_s"] for x in mat)
        m_med = statistics.median(x["tok_s"] for x in mat)
        pair_ratios = [m["tok_s"] / f["tok_s"] for f, m in zip(fwd, mat)]
        # Noise floor: per batch, the fastest capture across repeats (contention comes in bursts).
        # forward floor = sum of those; materialize floor = its capture floor + its least non-capture time.
        # per-batch capture times: on a GPU materialize's capture span is the forward's launch only (its copies
        # overlap the next forward, zgdata/core/host_copy.py), so this floor is a CPU figure
        n_b = len(fwd[0]["per_batch"])
        f_floor_s = sum(min(x["per_batch"][j] for x in fwd) for j in range(n_b))
        m_cap_floor_s = sum(min(x["per_batch"][j] for x in mat) for j in range(n_b))
        m_other_s = min(x["wall_s"] - sum(x["per_batch"]) for x in mat)
        f_floor, m_floor = n_tok / f_floor_s, n_tok / (m_cap_floor_s + m_other_s)
        l_best, l_med = max(loader["loader_Bps"]), statistics.median(loader["loader_Bps"])
        mm_best, mm_med = max(loader["memmap_Bps"]), statistics.median(loader["memmap_Bps"])
        disk_ratios = [d["ratio"] for d in disk.values()]

        log("")
        log("RESULTS")
        log("-" * 78)
        log(f"{'figure':<44}{'best':>12}{'median':>12}{'goal':>9}")
        log(f"{'forward-only (capture loop), tok/s':<44}{f_best:12.1f}{f_med:12.1f}")
        log(
            f"{'forward-only incl. model load, tok/s':<44}{fl_best:12.1f}{statistics.median(x['tok_s_incl_load'] for x in fwd):12.1f}"
        )
        log(f"{'materialize end to end, tok/s':<44}{m_best:12.1f}{m_med:12.1f}")
        log(f"{'RATIO materialize / forward-only':<44}{m_best / f_best:12.3f}{m_med / f_med:12.3f}{'>=0.90':>9}")
        log(
            f"{'  noise-floor estimate (per-batch minima)':<44}{m_floor / f_floor:12.3f}"
            f"   fwd {f_floor:.1f} tok/s, mat {m_floor:.1f} tok/s (capture {m_cap_floor_s:.2f}s + other {m_other_s:.2f}s)"
        )
        log(f"{'  (per alternating pair)':<44}{'  '.join(f'{r:.3f}' for r in pair_ratios):>24}")
        log(f"{'  ratio vs forward incl. load':<44}{m_best / fl_best:12.3f}")
        log(
            f"{'disk bytes/token/boundary / (hidden*2)':<44}{max(disk_ratios):12.4f}{statistics.median(disk_ratios):12.4f}"
            f"{'(max/med)':>9}"
        )
        log(f"{'loader ' + loader['pair'] + ' batches(), MB/s':<44}{l_best / 1e6:12.1f}{l_med / 1e6:12.1f}")
        log(
            f"{'  loader, checksum on every read, MB/s':<44}{max(loader['recheck_Bps']) / 1e6:12.1f}"
            f"{statistics.median(loader['recheck_Bps']) / 1e6:12.1f}"
        )
        log(
            f"{'  RATIO loader (checksum every read) / memmap':<44}{max(loader['recheck_Bps']) / mm_best:12.3f}"
            f"{statistics.median(loader['recheck_Bps']) / mm_med:12.3f}"
        )
        log(
            f"{'  loader read path, no prefetch thread, MB/s':<44}{max(loader['take_Bps']) / 1e6:12.1f}"
            f"{statistics.median(loader['take_Bps']) / 1e6:12.1f}"
        )
        log(
            f"{'  diag: same takes, rows sorted per batch':<44}{max(loader['sorted_Bps']) / 1e6:12.1f}"
            f"{statistics.median(loader['sorted_Bps']) / 1e6:12.1f}"
        )
        if loader.get("pages_Bps"):
            log(
                f"{'  diag: np.memmap onto the Lance pages':<44}{max(loader['pages_Bps']) / 1e6:12.1f}"
                f"{statistics.median(loader['pages_Bps']) / 1e6:12.1f}"
            )
        log(f"{'np.memmap same rows, MB/s':<44}{mm_best / 1e6:12.1f}{mm_med / 1e6:12.1f}")
        log(f"{'RATIO loader / memmap':<44}{l_best / mm_best:12.3f}{l_med / mm_med:12.3f}{'>=0.5':>9}")
        log("-" * 78)
        log(
            f"loader pass: {loader['steps']} train batches ({loader['epoch_steps']} per epoch) of {loader['batch_size']} seqs, "
            f"{loader['bytes_per_pass'] / 1e6:.1f} MB (x and y) per pass; "
            f"loader runs MB/s {[round(x / 1e6) for x in loader['loader_Bps']]}, "
            f"no-thread take runs MB/s {[round(x / 1e6) for x in loader['take_Bps']]}, "
            f"memmap runs MB/s {[round(x / 1e6) for x in loader['memmap_Bps']]}"
        )
        log(f"disk per boundary (whole dir / data files only, hidden*2 = {hidden * 2} B/token):")
        for n, d in disk.items():
            log(
                f"  {n}: {d['bytes'] / 1e6:8.2f} MB  {d['per_tok']:8.1f} B/tok  ratio {d['ratio']:.4f} "
                f"(data {d['data_ratio']:.4f})  fragments={d['fragments']} versions={d['versions']}"
            )
        log(
            f"foreign CPU share during timed runs (0 = quiet): forward {[round(x['foreign'], 2) for x in fwd]}, "
            f"materialize {[round(x['foreign'], 2) for x in mat]}, loader/memmap "
            f"{[round(x, 2) for x in loader['foreign']]}"
        )
        log(f"loadavg(end)={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        ok = m_best / f_best >= 0.90 and l_best / mm_best >= 0.5
        log(f"goals met: {'yes' if ok else 'NO'}")
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            log(f"kept {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: materialize vs teacher-forward-only, on-disk size, boundary-pair loader vs np.memmap.

Not a test. One run measures, side by side on the same batches (these machines are
noisy, so compare the ratios, not the absolute figures):

  1. teacher-forward-only throughput (tokens/s): the prepared teacher, loaded as
     materialize loads it, runs ``capture`` over every token row in materialize's
     batch size; nothing is written.
  2. ``materialize(...)`` end to end (tokens/s); data/boundaries and data/.staging
     are deleted before each run. (1) and (2) alternate ``--repeats`` times each;
     the best of each is compared (the median is printed too).
  3. bytes on disk per token per boundary / (hidden x 2).
  4. ``BoundaryPair.batches`` over every train batch (batch 4), bytes/s, against
     reading the same rows of the same bytes from an ``np.memmap`` of a raw .npy.

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
import threading
import time
from pathlib import Path

os.environ.setdefault("ZG_QUIET", "1")  # no progress bars in the log (see --progress)

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import zgdata.materialize as zmat  # noqa: E402
from zgdata.capture import capture  # noqa: E402
from zgdata.config import CorpusConfig, MaterializeConfig, PartitionConfig, TeacherConfig, section  # noqa: E402
from zgdata.lance_io import dir_bytes, open_dataset  # noqa: E402
from zgdata.layout import Layout  # noqa: E402
from zgdata.reader import BoundaryPair  # noqa: E402
from zgdata.teacher import load_teacher, prepare, read_teacher_json  # noqa: E402
from zgdata.tokens import read_tokens, tokenize, tokens_meta  # noqa: E402
from zgtrain.pipeline import profile_params  # noqa: E402


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
        have = tj.get("source") == tcfg.source and tj.get("dtype") == tcfg.dtype \
            and tj["architecture"]["num_layers"] >= part.boundaries[-1]
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
        have_tok = (lin["seq_len"] == ccfg.seq_len and sp["max_train_seqs"] == ccfg.max_train_seqs
                    and sp["max_heldout_seqs"] == ccfg.max_heldout_seqs and sp["heldout"] == sorted(ccfg.heldout)
                    and sp["documents"] == sorted(ccfg.documents) and sp["seed"] == ccfg.seed
                    and lin["tokenizer_sha256"] == read_teacher_json(layout)["tokenizer_sha256"])
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


def forward_only(layout: Layout, mcfg: MaterializeConfig, part: PartitionConfig) -> dict:
    """Exactly materialize's compute (token reads + capture, same batches), no writes."""
    t0 = time.perf_counter()
    model, _ = load_teacher(layout, dtype=mcfg.compute_dtype, with_tokenizer=False)
    t_load = time.perf_counter() - t0
    storage = getattr(torch, mcfg.storage_dtype)
    ds = open_dataset(layout.tokens, kind="tokens")
    n_rows = ds.count_rows()
    seq_len = tokens_meta(layout)["lineage"]["seq_len"]
    t1 = time.perf_counter()
    read_s = 0.0
    sink = 0.0
    for lo in range(0, n_rows, mcfg.batch_size):
        rows = np.arange(lo, min(lo + mcfg.batch_size, n_rows))
        tr = time.perf_counter()
        ids, _ = read_tokens(layout, rows, ds=ds)
        read_s += time.perf_counter() - tr
        caps = capture(model, ids, part.boundaries, storage_dtype=storage)
        sink += float(caps[part.boundaries[-1]][0, 0, 0])  # keep the result alive / observable
    loop_s = time.perf_counter() - t1
    tokens = n_rows * seq_len
    del model
    return {"tokens": tokens, "load_s": t_load, "loop_s": loop_s, "read_tokens_s": read_s,
            "total_s": t_load + loop_s, "tok_s": tokens / loop_s, "tok_s_incl_load": tokens / (t_load + loop_s)}


# ---------------------------------------------------------------------------------------------
# 2. materialize end to end (with a section breakdown from wrapped module globals)


class _Sections:
    """Wrap functions that zgdata.materialize looks up as module globals, to time its sections."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.acc = {}
        self.last_capture_end = None

    def add(self, key, dt):
        with self.lock:
            self.acc[key] = self.acc.get(key, 0.0) + dt

    def wrap(self, key, fn, *, mark_capture=False):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                e = time.perf_counter()
                self.add(key, e - t)
                if mark_capture:
                    self.last_capture_end = e
        return inner

    def install(self):
        self.saved = {n: getattr(zmat, n) for n in ("capture", "load_teacher", "read_tokens", "_finalize")}
        self.saved_flush = zmat._Writer._flush
        zmat.capture = self.wrap("capture", self.saved["capture"], mark_capture=True)
        zmat.load_teacher = self.wrap("load_teacher", self.saved["load_teacher"])
        zmat.read_tokens = self.wrap("read_tokens", self.saved["read_tokens"])
        zmat._finalize = self.wrap("finalize", self.saved["_finalize"])
        sec = self

        def flush(w):
            if not w.pending:
                return sec.saved_flush(w)
            t = time.perf_counter()
            try:
                return sec.saved_flush(w)
            finally:
                sec.add("writer_flush(bg)", time.perf_counter() - t)
                sec.add("writer_flushes", 1)
        zmat._Writer._flush = flush

    def uninstall(self):
        for n, f in self.saved.items():
            setattr(zmat, n, f)
        zmat._Writer._flush = self.saved_flush


SECTIONS = _Sections()


def run_materialize(layout: Layout, mcfg: MaterializeConfig, part: PartitionConfig) -> dict:
    clear_outputs(layout)
    SECTIONS.reset()
    t0 = time.perf_counter()
    res = zmat.materialize(mcfg, part, layout=layout)
    t_end = time.perf_counter()
    wall = t_end - t0
    assert not res.skipped, "materialize skipped: outputs were not cleared"
    out = {"tokens": res.tokens, "wall_s": wall, "seconds": res.seconds, "tok_s": res.tokens / wall}
    s = dict(SECTIONS.acc)
    if SECTIONS.last_capture_end is not None:
        s["after_last_capture(tail)"] = t_end - SECTIONS.last_capture_end
    out["sections"] = s
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
        seq_len = json.loads(ds.schema.field("hidden").metadata[b"zg.shape"])[0]
        b = dir_bytes(p)
        data_b = sum(f.stat().st_size for f in (p / "data").rglob("*") if f.is_file()) if (p / "data").exists() else b
        tok = rows * seq_len
        out[n] = {"bytes": b, "data_bytes": data_b, "tokens": tok, "per_tok": b / tok,
                  "ratio": b / tok / (hidden * 2), "data_ratio": data_b / tok / (hidden * 2),
                  "fragments": len(ds.get_fragments()), "versions": len(ds.versions())}
    return out


# ---------------------------------------------------------------------------------------------
# 4. loader vs memmap


def loader_vs_memmap(layout: Layout, part: PartitionConfig, scratch: Path, *, batch_size: int,
                     repeats: int) -> dict:
    a, b = part.names[0], part.names[1]
    pair = BoundaryPair(layout.boundary(a), layout.boundary(b))
    n_train = len(pair.rows("train"))
    steps = -(-n_train // batch_size)
    batch_rows = [pair.batch_rows("train", s, batch_size, 0) for s in range(steps)]

    # the same bytes, raw: one (N, T, C) uint16 .npy per side
    full_x, full_y = pair.input.take(np.arange(len(pair.input.seq_ids))), pair.output.take(np.arange(len(pair.output.seq_ids)))
    paths = []
    for name, full in (("x", full_x), ("y", full_y)):
        p = scratch / f"memmap_{name}.npy"
        arr = np.lib.format.open_memmap(p, mode="w+", dtype=np.uint16, shape=tuple(full.shape))
        arr[:] = full.view(torch.int16).numpy().view(np.uint16)
        arr.flush()
        del arr
        paths.append(p)
    del full_x, full_y

    def run_loader():
        nbytes = 0
        t = time.perf_counter()
        got = []
        for step, rows, x, y in pair.batches("train", start_step=0, steps=steps, batch_size=batch_size, seed=0):
            nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
            got.append(rows)
        dt = time.perf_counter() - t
        assert all(np.array_equal(g, r) for g, r in zip(got, batch_rows)) and len(got) == steps
        return nbytes, dt

    def run_memmap():
        mx = np.load(paths[0], mmap_mode="r")
        my = np.load(paths[1], mmap_mode="r")
        nbytes = 0
        t = time.perf_counter()
        for rows in batch_rows:
            x = torch.from_numpy(mx[rows]).view(torch.bfloat16)   # fancy index: a copy out of the map
            y = torch.from_numpy(my[rows]).view(torch.bfloat16)
            nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
        dt = time.perf_counter() - t
        return nbytes, dt

    # correctness: same bytes on one batch
    x0, y0 = pair.take(batch_rows[0])
    mx = np.load(paths[0], mmap_mode="r")
    assert torch.equal(x0.view(torch.int16), torch.from_numpy(mx[batch_rows[0]].view(np.int16))), "memmap copy differs"
    del mx

    run_loader(), run_memmap()  # warm the page cache / first-open costs
    L, M = [], []
    for _ in range(repeats):
        nb, dt = run_loader()
        L.append(nb / dt)
        nbm, dtm = run_memmap()
        assert nbm == nb
        M.append(nbm / dtm)
    for p in paths:
        p.unlink()
    return {"pair": f"{a}->{b}", "steps": steps, "batch_size": batch_size, "bytes_per_pass": nb,
            "loader_Bps": L, "memmap_Bps": M}


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
    ap.add_argument("--batch-size", type=int, default=None, help="override materialize.batch_size")
    ap.add_argument("--commit-rows", type=int, default=None, help="override materialize.commit_rows")
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

    cmd = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0]))] + (argv if argv is not None else sys.argv[1:]))
    log("=" * 78)
    log(f"command      : {cmd}")
    log(f"host         : {platform.node()}  {platform.machine()}  cpus={os.cpu_count()}  "
        f"loadavg(start)={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    log(f"python/torch : {platform.python_version()} / torch {torch.__version__}  "
        f"num_threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()}")
    try:
        import lance
        import pyarrow
        import transformers
        log(f"libs         : pylance {lance.__version__}  pyarrow {pyarrow.__version__}  "
            f"transformers {transformers.__version__}  numpy {np.__version__}")
    except Exception:  # informational only
        pass
    log(f"project      : {root}  profile={args.profile}")
    log(f"corpus       : seq_len={params['corpus']['seq_len']} max_train_seqs={params['corpus']['max_train_seqs']} "
        f"max_heldout_seqs={params['corpus']['max_heldout_seqs']}")
    log(f"materialize  : {mcfg}")
    log(f"partition    : {part.boundaries}")
    log("=" * 78)

    try:
        setup = setup_project(root, params, force=args.force_prepare)
        tmeta = tokens_meta(layout)
        rows = tmeta["rows"]
        hidden = read_teacher_json(layout)["architecture"]["hidden_size"]
        n_tok = sum(rows.values()) * tmeta["lineage"]["seq_len"]
        log(f"tokens       : rows={rows} tokens={n_tok} hidden={hidden} "
            f"batches={-(-sum(rows.values()) // mcfg.batch_size)} of {mcfg.batch_size}")
        for k, v in setup.items():
            log(f"setup        : {k} = {v:.1f}")

        # 1 + 2, alternating
        SECTIONS.install()
        fwd, mat = [], []
        try:
            for i in range(max(args.repeats, 1)):
                f = forward_only(layout, mcfg, part)
                fwd.append(f)
                log(f"[{i}] forward-only : {f['tok_s']:8.1f} tok/s  loop {f['loop_s']:6.2f}s  "
                    f"(load {f['load_s']:.2f}s, token reads {f['read_tokens_s']:.3f}s; "
                    f"incl. load {f['tok_s_incl_load']:.1f} tok/s)")
                m = run_materialize(layout, mcfg, part)
                mat.append(m)
                sec = "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in m["sections"].items())
                log(f"[{i}] materialize  : {m['tok_s']:8.1f} tok/s  wall {m['wall_s']:6.2f}s  "
                    f"ratio(this pair) {m['tok_s'] / f['tok_s']:.3f}")
                log(f"      sections   : {sec}")
        finally:
            SECTIONS.uninstall()

        disk = disk_figures(layout, part)
        loader = loader_vs_memmap(layout, part, root, batch_size=args.loader_batch, repeats=args.loader_repeats)

        f_best = max(x["tok_s"] for x in fwd)
        f_med = statistics.median(x["tok_s"] for x in fwd)
        fl_best = max(x["tok_s_incl_load"] for x in fwd)
        m_best = max(x["tok_s"] for x in mat)
        m_med = statistics.median(x["tok_s"] for x in mat)
        pair_ratios = [m["tok_s"] / f["tok_s"] for f, m in zip(fwd, mat)]
        l_best, l_med = max(loader["loader_Bps"]), statistics.median(loader["loader_Bps"])
        mm_best, mm_med = max(loader["memmap_Bps"]), statistics.median(loader["memmap_Bps"])
        disk_ratios = [d["ratio"] for d in disk.values()]

        log("")
        log("RESULTS")
        log("-" * 78)
        log(f"{'figure':<44}{'best':>12}{'median':>12}{'goal':>9}")
        log(f"{'forward-only (capture loop), tok/s':<44}{f_best:12.1f}{f_med:12.1f}")
        log(f"{'forward-only incl. model load, tok/s':<44}{fl_best:12.1f}{statistics.median(x['tok_s_incl_load'] for x in fwd):12.1f}")
        log(f"{'materialize end to end, tok/s':<44}{m_best:12.1f}{m_med:12.1f}")
        log(f"{'RATIO materialize / forward-only':<44}{m_best / f_best:12.3f}{m_med / f_med:12.3f}{'>=0.90':>9}")
        log(f"{'  (per alternating pair)':<44}{'  '.join(f'{r:.3f}' for r in pair_ratios):>24}")
        log(f"{'  ratio vs forward incl. load':<44}{m_best / fl_best:12.3f}")
        log(f"{'disk bytes/token/boundary / (hidden*2)':<44}{max(disk_ratios):12.4f}{statistics.median(disk_ratios):12.4f}"
            f"{'(max/med)':>9}")
        log(f"{'loader ' + loader['pair'] + ' batches(), MB/s':<44}{l_best / 1e6:12.1f}{l_med / 1e6:12.1f}")
        log(f"{'np.memmap same rows, MB/s':<44}{mm_best / 1e6:12.1f}{mm_med / 1e6:12.1f}")
        log(f"{'RATIO loader / memmap':<44}{l_best / mm_best:12.3f}{l_med / mm_med:12.3f}{'>=0.5':>9}")
        log("-" * 78)
        log(f"loader pass: {loader['steps']} train batches of {loader['batch_size']} seqs, "
            f"{loader['bytes_per_pass'] / 1e6:.1f} MB (x and y) per pass; "
            f"loader runs MB/s {[round(x / 1e6) for x in loader['loader_Bps']]}, "
            f"memmap runs MB/s {[round(x / 1e6) for x in loader['memmap_Bps']]}")
        log("disk per boundary (whole dir / data files only, hidden*2 = %d B/token):" % (hidden * 2))
        for n, d in disk.items():
            log(f"  {n}: {d['bytes'] / 1e6:8.2f} MB  {d['per_tok']:8.1f} B/tok  ratio {d['ratio']:.4f} "
                f"(data {d['data_ratio']:.4f})  fragments={d['fragments']} versions={d['versions']}")
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

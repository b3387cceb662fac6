"""Benchmark: the boundary data plane at accelerator rates, without a teacher. Not a test; prints ratios measured
side by side in one run, on the same disk.

    python bench/write_path.py                       # hidden 576, 4 boundaries, 1 GB of bf16 per write
    python bench/write_path.py --hidden 4096 --boundaries 9 --mb 512
    python bench/write_path.py --rows-from PROJECT/data/boundaries/h05.lance   # real rows (sizes on real data)

Synthetic bf16 batches (B x T x hidden; a per-channel scale and a few outlier channels, or real rows read from a
boundary dataset) go through zg's own write path: ``materialize.writer.Writer`` with its pool of encoding threads
(encode, row checksum, exact stats), the Lance streams, the row-ordered commits and the journal, then
``staging.finalize``. Printed:

  plain write      the same number of bytes written from memory in 8 MiB chunks, then fsync (dd conv=fsync); and
                   the same with the file synced every ``materialize.write_behind_mb`` meanwhile, as the write path
                   syncs its files (``raw_vs_disk_write_behind_ratio``: the raw bits' path against that)
  write path       GB/s of bf16 input per codec and per writer-thread count (files fsynced at the end too), the
                   ratio to the plain write, the bytes on disk per bf16 byte, and the CPU seconds the process
                   spent per GB (all threads, Lance's own too); for the raw bits (``raw``: a fixed-size list column,
                   ``blob``: packed Lance blobs), the rate those allow on all cores at best (cores / core-s per GB),
                   a bound however well the work overlaps. The JSON's ``raw_vs_disk_ratio`` is the better of the two
                   layouts; ``raw_list_vs_disk_ratio`` and ``raw_blob_vs_disk_ratio`` are each
  per thread       one thread's encode + row checksum (the unit 0.22-0.25 GB/s described before this path), and the
                   whole job (with stats and the Lance record batch); the former path (zstd level 3 + blake2b) too
  pool             the encoding pool alone (no I/O), 2 threads / 1 thread
  loader           a boundary pair (raw, blob and the lossless codec) read by BoundaryPair.batches: a first epoch (every row decoded and checked) and
                   a warm one, / np.memmap of the same rows: a bare loop that drops each batch at once, and the same
                   BoundaryPair.batches loader over the memmaps (read ahead, batches held by the consumer). This VM
                   backs guest memory on first touch (measured and printed: ~0.2 GB/s, against 3-10 for memory the
                   guest has touched before), which a machine that has run anything meets rarely; so the decoded
                   cache's size is touched and freed before the first epoch, and the figure measures zg's reads, not
                   the VM's memory faults. For a compressed codec, zstd alone over the pair's frames on every core
                   (bench/write_path_reads.py): a first epoch's bound. Then the bare memmap loop and a fresh pair's
                   first epoch again from the disk, the files dropped from the page cache before each
                   (posix_fadvise DONTNEED): what every epoch of a boundary larger than memory reads
                   (``loader_first_epoch_from_disk_ratio``)
  verify --full    every row's checksum streamed (``BoundaryDataset.scan``) / reading the same files
  trust check      ``trust.verify`` of the pair against a dvc.lock, 1 thread and all cores, / copying the same
                   bytes (what `dvc pull` from a local remote does at least)

Each figure is the best of ``--repeats`` runs (these machines are shared: the JSON's ``foreign_cpu_share`` is the
share of the cores other processes took meanwhile). The last line is one JSON object with every figure. Default
run: a few minutes on 2 cores. A write-path run is 1 GB by default (``--mb``): a run also creates, commits and syncs
its datasets, some 30 ms whatever its length, which a real materialize (gigabytes to terabytes) spreads over far
more bytes; at 128, 512 and 2,048 MB the raw bits' path (blob, 2 threads, width 576) ran at 0.66, 0.82 and 0.91 of
the plain write of the same bytes (docs/results/write-path.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from harness import CpuMeter, wait_quiet
from write_path_reads import B, decode_ceiling, disk_line, disk_ratios, fsync_tree, loader, trust_check, verify_full

from zgdata.config import MaterializeConfig
from zgdata.core.runtime import cores
from zgdata.materialize.encode import Encoder, encode_batch
from zgdata.materialize.staging import Journal, boundary_schema, finalize
from zgdata.materialize.writer import Writer
from zgdata.store import integrity
from zgdata.store.codec import codec_meta, format_of, hidden_arrays
from zgdata.store.integrity import checksum_array


def log(msg: str) -> None:
    print(msg, flush=True)


def synthetic(n: int, seq_len: int, hidden: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` distinct (B, T, C) bf16 batches shaped like residual streams: per-channel scales, a few outliers."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(hidden, generator=g) * 0.5)
    scale[torch.randint(0, hidden, (max(1, hidden // 200),), generator=g)] *= 50.0
    return [(torch.randn(B, seq_len, hidden, generator=g) * scale).to(torch.bfloat16) for _ in range(n)]


def real(path: Path, n: int) -> list[torch.Tensor]:
    from zgdata.boundaries import open_boundary

    b = open_boundary(path)
    rows = min(n * B, len(b.seq_ids))
    x = b.take(np.arange(rows))
    return [x[i : i + B].clone() for i in range(0, rows - B + 1, B)]


RAW_BITS = {"raw", "blob"}  # the codecs that store the bits as they are: a fixed-size list, or packed Lance blobs


def no_huge_pages() -> None:
    """Turn off numpy's madvise(MADV_HUGEPAGE) on its large arrays for the rest of this process."""
    (getattr(np, "_core", None) or np.core).multiarray._set_madvise_hugepage(False)  # numpy 2, or 1.26


def cpu_s() -> float:
    """CPU seconds this process has used, all its threads (Lance's own included)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def plain_write(path: Path, nbytes: int, behind_mb: int = 0) -> tuple[float, float]:
    """(seconds, CPU seconds) to write ``nbytes`` from memory and fsync them: the disk's rate for this run.
    ``behind_mb``: also sync the file every so many MB in a thread meanwhile, as the write path does
    (zgdata/materialize/write_behind.py): the disk's rate when its writes overlap the filling."""
    from zgdata.materialize.write_behind import WriteBehind

    chunk = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes()
    c0, t0 = cpu_s(), time.perf_counter()
    behind = WriteBehind([path.parent], behind_mb << 20)
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = f.write(chunk[: min(left, len(chunk))])
            left -= n
            behind.add(n)
        f.flush()
        behind.close()
        os.fsync(f.fileno())
    dt, cpu = time.perf_counter() - t0, cpu_s() - c0
    path.unlink()
    return dt, cpu


def _meta(name: str, layer: int, rows: int, seq_len: int, hidden: int, codec: str, checksum: str) -> dict:
    fmt = format_of(codec, checksum)
    lineage = {
        "teacher_sha256": "bench",
        "tokenizer_sha256": "bench",
        "tokens_fingerprint": "bench",
        "layer": layer,
        "storage_dtype": "bfloat16",
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "capture_version": 1,
    }
    meta = {
        "kind": "boundary",
        "name": name,
        "layer": layer,
        "fingerprint": f"bench-{name}",
        "lineage": lineage,
        "seq_len": seq_len,
        "hidden": hidden,
        "rows": {"train": rows},
        "format_version": fmt,
        "codec": codec_meta(codec),
        "complete": False,
    }
    if fmt >= 4:
        meta["checksum"] = checksum
    return meta


def write_path(work: Path, xs, *, boundaries: int, batches: int, codec: str, threads: int, publish: bool) -> dict:
    """The real write path over ``batches`` batches of ``boundaries`` boundaries; seconds, bytes in and on disk."""
    seq_len, hidden = xs[0].shape[1:]
    checksum = integrity.WRITE_CHECKSUM
    names = [f"h{i:02d}" for i in range(boundaries)]
    stage = work / f"stage-{codec}-{threads}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    rows = batches * B
    schemas = {
        n: boundary_schema(_meta(n, i, rows, seq_len, hidden, codec, checksum), seq_len, hidden, "bfloat16", codec)
        for i, n in enumerate(names)
    }
    cfg = MaterializeConfig(codec=codec, writer_threads=threads, commit_mb=1 << 20)
    journal = Journal(stage / "journal.json")
    w = Writer(
        stage=stage,
        names=names,
        schemas=schemas,
        journal=journal,
        cfg=cfg,
        total_rows=rows,
        seq_len=seq_len,
        hidden=hidden,
        checksum=checksum,
    )
    splits = ["train"] * B
    c0, t0 = cpu_s(), time.perf_counter()
    w.start()
    for i in range(batches):  # a GPU hands over batches as fast as the writer takes them
        w.q.put((np.arange(i * B, (i + 1) * B), splits, {n: xs[(i + k) % len(xs)] for k, n in enumerate(names)}))
    w.q.put(None)
    w.join()
    if w.error is not None:
        raise w.error
    fsync_tree(stage)
    dt, cpu = time.perf_counter() - t0, cpu_s() - c0
    disk = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file() and "/data/" in str(f))  # blob sidecars too
    out = {"seconds": dt, "cpu_s": cpu, "bytes": rows * seq_len * hidden * 2 * boundaries, "disk": disk, "stage": stage}
    if publish:
        finals = {n: work / f"pub-{codec}" / f"{n}.lance" for n in names}
        (work / f"pub-{codec}").mkdir(exist_ok=True)
        finalize(stage, names, journal, finals, n_rows=rows, row_bytes=seq_len * hidden * 2, file_mb=16384)
        out["published"] = finals
    return out


def lance_alone(work: Path, xs, *, boundaries: int, batches: int, codec: str) -> float:
    """GB/s (of bf16 input) of the Lance streams alone: record batches encoded beforehand, written as the write path
    writes them (one ``write_fragments`` per boundary, in threads), then fsynced: the ceiling the encoding feeds."""
    from zgdata.materialize.staging import Streams

    seq_len, hidden = xs[0].shape[1:]
    schema = boundary_schema(None, seq_len, hidden, "bfloat16", codec)
    enc = [
        encode_batch(
            x, np.arange(B), ["train"] * B, schema=schema, storage_dtype="bfloat16", codec=codec, checksum="xxh3_128"
        )
        for x in xs
    ]
    stage = work / f"lance-{codec}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    names = [f"h{i:02d}" for i in range(boundaries)]
    t0 = time.perf_counter()
    streams = Streams(stage, names, schema, rows_per_file=2**31 - 1, mode="create")
    for i in range(batches):
        for k, n in enumerate(names):
            streams.put(n, enc[(i + k) % len(enc)].batch)
    streams.close()
    fsync_tree(stage)
    dt = time.perf_counter() - t0
    shutil.rmtree(stage)
    return batches * boundaries * xs[0].numel() * 2 / dt / 1e9


def per_thread(xs, codec: str, checksum: str, reps: int) -> tuple[float, float]:
    """One thread, no I/O: (encode + row checksum, the whole encode job) in GB/s of bf16 input."""
    nbytes = sum(x.numel() * 2 for x in xs) * reps
    t0 = time.perf_counter()
    for _ in range(reps):
        for x in xs:
            checksum_array(hidden_arrays(x, "bfloat16", codec)[1], algo=checksum)
    enc = nbytes / (time.perf_counter() - t0) / 1e9
    schema = boundary_schema(None, xs[0].shape[1], xs[0].shape[2], "bfloat16", codec)
    rows, splits = np.arange(B), ["train"] * B
    t0 = time.perf_counter()
    for _ in range(reps):
        for x in xs:
            encode_batch(x, rows, splits, schema=schema, storage_dtype="bfloat16", codec=codec, checksum=checksum)
    return enc, nbytes / (time.perf_counter() - t0) / 1e9


def pool_rate(xs, codec: str, threads: int, batches: int, boundaries: int) -> float:
    schema = boundary_schema(None, xs[0].shape[1], xs[0].shape[2], "bfloat16", codec)
    enc = Encoder(threads=threads, schema=schema, storage_dtype="bfloat16", codec=codec, checksum="xxh3_128")
    t0 = time.perf_counter()
    for i in range(batches):
        enc.submit(np.arange(B), ["train"] * B, {k: xs[(i + k) % len(xs)] for k in range(boundaries)})
        for _ in enc.done():
            pass
    for _ in enc.done(keep=0):
        pass
    dt = time.perf_counter() - t0
    enc.close()
    return batches * boundaries * xs[0].numel() * 2 / dt / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=576, help="hidden size (576 SmolLM2-135M, 2048, 4096 8B)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--boundaries", type=int, default=4, help="boundaries captured per batch")
    ap.add_argument(
        "--mb",
        type=int,
        default=1024,
        help="MB of bf16 boundary bytes per write-path run (each run also pays some 30 ms to create, commit and "
        "sync its datasets: an eighth of a 256 MB run of the raw bits at width 576, a thirtieth of the default)",
    )
    ap.add_argument("--codecs", default="raw,blob,zstd,zstd_fast,zstd_blob")
    ap.add_argument("--threads", default="1,2", help="writer-thread counts to run")
    ap.add_argument(
        "--lossless", default="zstd_blob", help="the lossless codec the JSON figures are of (the default conversion's)"
    )
    ap.add_argument("--rows-from", type=Path, help="a boundary dataset whose rows to write (hidden from it)")
    ap.add_argument("--workdir", type=Path, help="scratch folder on the disk to measure (default: a temp dir)")
    ap.add_argument("--loader-mb", type=int, default=512, help="MB of bf16 in the boundary pair the reads measure")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the best is reported")
    ap.add_argument(
        "--quiet", type=float, default=0, help="first wait up to this many seconds for other processes to go quiet"
    )
    ap.add_argument(
        "--loader-cold",
        action="store_true",
        help="do not fault the decoded caches' memory in before each first epoch: the epoch pays the host's first "
        "touch of fresh memory, as a training process does",
    )
    ap.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="turn off numpy's madvise(MADV_HUGEPAGE) on large arrays for this run (zg's decoded cache is on 4 KiB "
        "pages either way: zgdata/store/decoded_cache.py small_pages)",
    )
    args = ap.parse_args(argv)
    if args.lossless not in args.codecs.split(","):
        ap.error(f"--lossless {args.lossless} is not among --codecs {args.codecs}: its write path makes the JSON line")
    if args.no_huge_pages:
        no_huge_pages()

    torch.set_num_threads(1)  # the forward's threads are the GPU's; the cores are the writer's
    xs = real(args.rows_from, 16) if args.rows_from else synthetic(4, args.seq_len, args.hidden)
    seq_len, hidden = xs[0].shape[1:]
    per_batch = args.boundaries * xs[0].numel() * 2
    batches = max(2, (args.mb << 20) // per_batch)
    threads = [int(t) for t in args.threads.split(",")]
    codecs = args.codecs.split(",")
    work = Path(tempfile.mkdtemp(prefix="zg-write-path-", dir=args.workdir))
    source = f"rows of {args.rows_from}" if args.rows_from else "synthetic"
    log(f"write path: {batches} batches x {args.boundaries} boundaries x {B}x{seq_len}x{hidden} bf16 ({source}),")
    log(f"  {batches * per_batch / 1e9:.2f} GB per run, in {work}, {os.cpu_count()} cores")
    res: dict = {"hidden": hidden, "boundaries": args.boundaries, "gb_per_run": batches * per_batch / 1e9}
    reps = range(max(1, args.repeats))
    if args.quiet:
        log(f"other processes' share of the cores before the run: {wait_quiet(0.1, args.quiet):.2f}")
    try:
        with CpuMeter() as meter:
            disk_s, disk_cpu = (
                min(v) for v in zip(*(plain_write(work / "plain.bin", batches * per_batch) for _ in reps))
            )
            disk_cpu /= batches * per_batch / 1e9
            disk_gbps = batches * per_batch / disk_s / 1e9
            log(f"plain write + fsync                     {disk_gbps:6.2f} GB/s")
            res["plain_write_gbps"] = disk_gbps
            behind_mb = MaterializeConfig().write_behind_mb
            wb_s = min(plain_write(work / "plain.bin", batches * per_batch, behind_mb)[0] for _ in reps)
            wb_gbps = res["plain_write_behind_gbps"] = batches * per_batch / wb_s / 1e9
            log(f"  the same, synced every {behind_mb} MB meanwhile  {wb_gbps:6.2f} GB/s (as the write path syncs)")
            for codec in codecs:
                for t in threads:
                    best, cpu = None, None
                    for _ in reps:
                        r = write_path(
                            work, xs, boundaries=args.boundaries, batches=batches, codec=codec, threads=t, publish=False
                        )
                        best = r["seconds"] if best is None else min(best, r["seconds"])
                        cpu = r["cpu_s"] if cpu is None else min(cpu, r["cpu_s"])
                        shutil.rmtree(r["stage"])
                    gbps = r["bytes"] / best / 1e9
                    res[f"write_{codec}_{t}t_gbps"] = gbps
                    res[f"write_{codec}_{t}t_core_s_per_gb"] = cpu / (r["bytes"] / 1e9)
                    res[f"size_{codec}"] = r["disk"] / r["bytes"]
                    log(
                        f"write path {codec:<10} {t} thread{'s' if t > 1 else ' '}        {gbps:6.2f} GB/s  "
                        f"{gbps / disk_gbps:5.2f} of the plain write  {r['disk'] / r['bytes']:.3f} bytes on disk "
                        f"per bf16 byte  {cpu / (r['bytes'] / 1e9):.2f} core-s per GB"
                    )
            for codec in RAW_BITS & set(codecs):  # what the cores allow, however well the work overlaps
                n_cores = cores()
                ceiling = n_cores / res[f"write_{codec}_{max(threads)}t_core_s_per_gb"]
                res[f"{codec}_cpu_ceiling_vs_disk_ratio"] = ceiling / disk_gbps
                log(
                    f"  {codec}: the CPU work alone allows at most {ceiling:.2f} GB/s on {n_cores} cores, "
                    f"{ceiling / disk_gbps:.2f} of the plain write (plain write: {disk_cpu:.2f} core-s per GB)"
                )
            for codec in codecs:
                g = max(lance_alone(work, xs, boundaries=args.boundaries, batches=batches, codec=codec) for _ in reps)
                res[f"lance_alone_{codec}_gbps"] = g
                log(
                    f"Lance streams alone {codec:<10} (pre-encoded)  {g:6.2f} GB/s  {g / disk_gbps:5.2f} of the plain write"
                )
            for codec, checksum in [(c, "xxh3_128") for c in codecs] + [("zstd", "blake2b")]:
                enc, job = (max(v) for v in zip(*(per_thread(xs, codec, checksum, reps=2) for _ in reps)))
                res[f"thread_{codec}_{checksum}_encode_gbps"], res[f"thread_{codec}_{checksum}_job_gbps"] = enc, job
                log(
                    f"one thread {codec:<10} + {checksum:<9}  encode+checksum {enc:6.2f} GB/s   with stats {job:6.2f} GB/s"
                )
            pools: dict[int, float] = {}
            for _ in reps:  # thread counts alternate within each repeat: a drift of the machine meets both alike
                for t in threads:
                    g = pool_rate(xs, args.lossless, t, batches // 2, args.boundaries)
                    pools[t] = max(pools.get(t, 0.0), g)
            for t, g in pools.items():
                log(f"encode pool {args.lossless} {t} thread(s), no I/O   {g:6.2f} GB/s")
            pubs = {}  # a boundary pair of --loader-mb for the reads, raw and lossless, written by the same path
            for codec in dict.fromkeys(["raw", *sorted(RAW_BITS & set(codecs)), args.lossless]):
                n = max(2, (args.loader_mb << 20) // (2 * xs[0].numel() * 2))
                pubs[codec] = write_path(
                    work, xs, boundaries=2, batches=n, codec=codec, threads=max(threads), publish=True
                )["published"]
            pub = pubs[args.lossless]
            for codec, datasets in pubs.items():
                runs = [loader(datasets, prefault=not args.loader_cold, from_disk=True) for _ in reps]
                lo = {k: max(r[k] for r in runs) for k in runs[0]}  # disk_resident too: the worst run's
                lo["first_touch_gbps"] = min(r["first_touch_gbps"] for r in runs)
                res[f"loader_{codec}"] = lo
                log(
                    f"loader {codec:<10} first epoch {lo['first_gbps']:.2f} GB/s, warm {lo['warm_gbps']:.2f}, np.memmap "
                    f"{lo['memmap_gbps']:.2f}: ratios {lo['first_gbps'] / lo['memmap_gbps']:.2f} and "
                    f"{lo['warm_gbps'] / lo['memmap_gbps']:.2f} (this VM's first touch of fresh memory: "
                    f"{lo['first_touch_gbps']:.2f} GB/s, {'not ' if args.loader_cold else ''}faulted in before the epoch)"
                )
                log(
                    f"  np.memmap through the same loader {lo['memmap_loader_gbps']:.2f} GB/s: first epoch "
                    f"{lo['first_gbps'] / lo['memmap_loader_gbps']:.2f} of it, warm "
                    f"{lo['warm_gbps'] / lo['memmap_loader_gbps']:.2f}"
                )
                log(disk_line(lo))
            lo = res.pop(f"loader_{args.lossless}")
            raw_lo = res.pop("loader_raw", None)
            blob_lo = res.pop("loader_blob", None)
            if args.lossless != "raw":  # zstd alone, every core, no Lance, no join, no checksum: a bound, not a rate
                dec = decode_ceiling(pub)
                res["zstd_decode_ceiling_ratio"] = dec / lo["memmap_gbps"]
                log(
                    f"  {args.lossless}: zstd alone decodes the pair's frames at {dec:.2f} GB/s of bf16 on every core, "
                    f"{dec / lo['memmap_gbps']:.2f} of np.memmap: the most a first epoch of this codec can reach here"
                )
            for codec, datasets in pubs.items():
                vfs = [verify_full(datasets) for _ in reps]
                vf = res[f"verify_{codec}"] = {k: max(r[k] for r in vfs) for k in vfs[0]}
                log(
                    f"verify every row, {codec:<10} {vf['scan_gbps']:.2f} GB/s of values (Lance's streaming scan "
                    f"{vf['lance_scan_gbps']:.2f}); reading the files {vf['read_gbps']:.2f} GB/s"
                )
            vf = res.pop(f"verify_{args.lossless}")
            vf_raw = res.pop("verify_raw", None)
            res.pop("verify_blob", None)
            tcs = [trust_check(work, pub) for _ in reps]
            tc = {k: min(r[k] for r in tcs) for k in tcs[0]}
            log(
                f"trust check of the pair ({tc['bytes'] / 1e6:.0f} MB): 1 thread {tc['check_1_s']:.2f} s, all cores "
                f"{tc['check_all_s']:.2f} s; copying it in (the pull) {tc['pull_s']:.2f} s"
            )
        t1, tn = min(threads), max(threads)
        # the raw bits' write path: the better of its two layouts, each also on its own line
        best_raw = max((res[k] for c in RAW_BITS if (k := f"write_{c}_{tn}t_gbps") in res), default=float("nan"))
        disk_bare, disk_through = disk_ratios(lo)  # the lossless pair's first epoch from the disk
        res.update(
            raw_vs_disk_ratio=best_raw / disk_gbps,
            raw_list_vs_disk_ratio=res.get(f"write_raw_{tn}t_gbps", float("nan")) / disk_gbps,
            raw_blob_vs_disk_ratio=res.get(f"write_blob_{tn}t_gbps", float("nan")) / disk_gbps,
            raw_vs_disk_write_behind_ratio=best_raw / wb_gbps,
            lossless_codec=args.lossless,
            lossless_gbps_per_thread=res[f"thread_{args.lossless}_xxh3_128_encode_gbps"],
            lossless_job_gbps_per_thread=res[f"thread_{args.lossless}_xxh3_128_job_gbps"],
            before_gbps_per_thread=res["thread_zstd_blake2b_encode_gbps"],
            lossless_size_ratio=res[f"size_{args.lossless}"],
            two_thread_speedup=pools[tn] / pools[t1],
            write_path_two_thread_speedup=res[f"write_{args.lossless}_{tn}t_gbps"]
            / res[f"write_{args.lossless}_{t1}t_gbps"],
            lossless_vs_disk_ratio=res[f"write_{args.lossless}_{tn}t_gbps"] / disk_gbps,
            loader_first_epoch_ratio=lo["first_gbps"] / lo["memmap_gbps"],
            loader_warm_ratio=lo["warm_gbps"] / lo["memmap_gbps"],
            loader_first_epoch_ratio_raw=raw_lo["first_gbps"] / raw_lo["memmap_gbps"] if raw_lo else float("nan"),
            loader_first_epoch_ratio_blob=blob_lo["first_gbps"] / blob_lo["memmap_gbps"] if blob_lo else float("nan"),
            loader_first_epoch_vs_memmap_loader=lo["first_gbps"] / lo["memmap_loader_gbps"],
            loader_first_epoch_from_disk_ratio=disk_bare,
            loader_first_epoch_from_disk_vs_memmap_loader=disk_through,
            loader_first_epoch_from_disk_ratio_raw=disk_ratios(raw_lo or {})[0],
            loader_first_epoch_vs_memmap_loader_raw=(
                raw_lo["first_gbps"] / raw_lo["memmap_loader_gbps"] if raw_lo else float("nan")
            ),
            first_touch_gbps=lo["first_touch_gbps"],
            verify_full_vs_read_ratio=vf["scan_gbps"] / vf["read_gbps"],
            verify_full_vs_read_ratio_raw=vf_raw["scan_gbps"] / vf_raw["read_gbps"] if vf_raw else float("nan"),
            verify_raw_vs_lance_scan=vf_raw["scan_gbps"] / vf_raw["lance_scan_gbps"] if vf_raw else float("nan"),
            trust_check_speedup_2_cores=tc["check_1_s"] / tc["check_all_s"],
            trust_check_vs_pull=tc["check_all_s"] / tc["pull_s"],
            foreign_cpu_share=meter.foreign,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

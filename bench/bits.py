"""The bits a refactor must not change: every block's ``state_sha256`` and every metrics JSON of a profile.

    python bench/bits.py record --out /tmp/bits-before.json            # tiny, tiny-search, local-tiny
    python bench/bits.py record --out /tmp/bits-after.json
    python bench/bits.py compare /tmp/bits-before.json /tmp/bits-after.json

``record`` scaffolds each profile in a fresh project (``zg init --profile P``), runs ``dvc repro`` with the
``zg`` of this interpreter's environment (``PYTHONPATH`` decides which tree it imports, so a worktree of the
commit before a refactor can be recorded with the same venv), and writes one JSON document: per profile, each
metrics file (``metrics/**/*.json``) with its wall-clock keys left out, and the ``state_sha256`` of every block
and local stage it names. ``compare`` exits 1 and names each key that differs. Bits hold per CPU kind and
thread count (docs/concepts/guarantees.md), so the record names the CPU model and compares only within one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from harness import BIN, run, scaffold

PROFILES = ("tiny", "tiny-search", "local-tiny")
TIMED_KEYS = {"seconds", "tokens_per_s", "wall_s", "elapsed_s", "timings", "started", "finished"}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _untimed(value):
    """VALUE with every wall-clock key left out, at any depth."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMED_KEYS}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def record_profile(profile: str, work: Path) -> dict:
    """Scaffold PROFILE under WORK, reproduce it, and return its metrics files (untimed) by path."""
    root = scaffold(work / profile, profile)
    run([BIN / "dvc", "repro"], root)  # harness.run: this environment's bin first on PATH, for the stages' `zg`
    files = sorted((root / "metrics").rglob("*.json"))
    if not files:
        sys.exit(f"profile {profile} wrote no metrics under {root / 'metrics'}")
    return {str(f.relative_to(root)): _untimed(json.loads(f.read_text())) for f in files}


def record(out: Path, profiles: tuple[str, ...], keep: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="zg-bits-"))
    try:
        doc = {"cpu": _cpu(), "threads": os.environ.get("OMP_NUM_THREADS"), "profiles": {}}
        for p in profiles:
            print(f"recording {p} ...", file=sys.stderr, flush=True)
            doc["profiles"][p] = record_profile(p, work)
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        n = sum(len(v) for v in doc["profiles"].values())
        print(f"{n} metrics files of {len(profiles)} profiles -> {out}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _diff(a, b, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}/{k}: only in {'first' if k in a else 'second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{where}/{k}")
        return out
    return [] if a == b else [f"{where}: {str(a)[:80]} != {str(b)[:80]}"]


def compare(first: Path, second: Path) -> int:
    a, b = (json.loads(p.read_text()) for p in (first, second))
    if a["cpu"] != b["cpu"]:
        sys.exit(f"recorded on two CPU kinds ({a['cpu']!r} vs {b['cpu']!r}): bits compare only within one")
    diffs = _diff(a["profiles"], b["profiles"], "")
    shas = sum(json.dumps(v).count("state_sha256") for v in a["profiles"].values())
    if diffs:
        print("\n".join(diffs))
        return 1
    print(f"identical: {len(a['profiles'])} profiles, {shas} state_sha256 fields, on {a['cpu']}")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="reproduce the profiles and write their bits")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--profiles", nargs="+", default=list(PROFILES))
    r.add_argument("--keep", action="store_true", help="keep the projects (their path is printed)")
    c = sub.add_parser("compare", help="exit 1 when two records differ")
    c.add_argument("first", type=Path)
    c.add_argument("second", type=Path)
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.out, tuple(a.profiles), a.keep)
    else:
        sys.exit(compare(a.first, a.second))


if __name__ == "__main__":
    main()

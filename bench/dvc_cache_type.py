"""`dvc checkout` of a boundary-sized file with each DVC cache type: what `zg init`'s choice costs.

    python bench/dvc_cache_type.py [--mb 100] [--repeats 3]

Not a test; prints the median wall time of `dvc checkout` of one file of --mb MB (random bytes, as
incompressible as hidden states) after the workspace copy is deleted, for cache.type ``hardlink`` and
``reflink,copy`` (a copy where the filesystem has no reflinks, e.g. ext4), and their ratio. It also reports
whether an in-place edit of the checked-out file changes the cache object (it does with a hardlink: the
workspace file is the cache object) and whether `dvc status` then sees the edit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import harness


def _dvc(*args: str, cwd: Path) -> str:
    return harness.run([harness.BIN / "dvc", *args], cwd).stdout


def _checkout_s(root: Path, data: Path) -> float:
    data.unlink()
    return harness.run([harness.BIN / "dvc", "checkout", "-q", "data.bin"], root).wall_s


def _edit_in_place(root: Path, data: Path) -> tuple[bool, bool]:
    """(the cache object changed, `dvc status` reports the edit) after one byte is flipped in place."""
    cache = [p for p in (root / ".dvc" / "cache").rglob("*") if p.is_file() and p.stat().st_size == data.stat().st_size]
    before = cache[0].read_bytes()[:1]
    os.chmod(data, 0o644)  # DVC makes linked files read-only; a user's tool may not care
    with open(data, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    changed = cache[0].read_bytes()[:1] != before
    return changed, "modified" in _dvc("status", cwd=root)


def run(mb: int, repeats: int) -> None:
    results = {}
    for ctype in ("hardlink", "reflink,copy"):
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            root = Path(tmp)
            harness.run(["git", "init", "-q"], root, capture=False)
            _dvc("init", "-q", cwd=root)
            _dvc("config", "cache.type", ctype, cwd=root)
            data = root / "data.bin"
            data.write_bytes(os.urandom(mb << 20))
            _dvc("add", "-q", "data.bin", cwd=root)
            times = [_checkout_s(root, data) for _ in range(repeats)]
            results[ctype] = statistics.median(times)
            changed, seen = _edit_in_place(root, data)
            print(
                f"cache.type {ctype:13s} dvc checkout of {mb} MB: median {results[ctype]:.3f} s over {repeats} "
                f"({', '.join(f'{t:.3f}' for t in times)}); in-place edit changes the cache object: {changed}; "
                f"dvc status sees it: {seen}"
            )
    print(f"ratio reflink,copy / hardlink: {results['reflink,copy'] / results['hardlink']:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    run(a.mb, a.repeats)

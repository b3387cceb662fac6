"""A restart never loses the run it replaces: it builds in a staging folder beside the old one and swaps it in
only when the new run reached its last checkpoint (zgtrain/fit/loop.py ``begin``/``publish``).

The damage is real: bytes flipped inside a Lance data file of the block's input boundary, in rows the trainer
reads only after its first step, so the per-row checksum stops the run half-way.
"""

from __future__ import annotations

import hashlib

import lance

from tests.helpers.assertions import assert_user_error
from tests.helpers.runners import zg_main
from zgdata.layout import Layout
from zgtrain.fit import loop

IMPORTANCE_ROWS = 16  # train.importance_rows: read before anything is written


def _flip_rows(path, rows) -> None:
    """XOR the middle 4 KiB of each row's stored hidden bytes (bf16, stored verbatim in one data file)."""
    ds = lance.dataset(str(path))
    for row in rows:
        want = ds.take([row], columns=["hidden"]).column("hidden").combine_chunks().values.to_numpy().tobytes()
        for f in sorted((path / "data").glob("*.lance")):
            data = bytearray(f.read_bytes())
            at = data.find(want)
            if at >= 0:
                start = at + (len(want) - 4096) // 2
                data[start : start + 4096] = bytes(b ^ 0xFF for b in data[start : start + 4096])
                f.write_bytes(bytes(data))
                break
        else:
            raise AssertionError(f"row {row}'s bytes are in no data file of {path}")


def _digests(d) -> dict:
    return {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in ("model.safetensors", "meta.json")}


def test_restart_over_corrupt_input_keeps_the_finished_block(tiny_project):
    layout = Layout(tiny_project)
    zg_main("train", "block", "b01", cwd=tiny_project)
    d = layout.block_dir("b01")
    before, files = _digests(d), sorted(p.name for p in d.iterdir())
    inp = layout.boundary("h02")
    _flip_rows(inp, range(IMPORTANCE_ROWS, lance.dataset(str(inp)).count_rows()))

    res = zg_main("train", "block", "b01", "--restart", cwd=tiny_project, check=False)
    assert_user_error(res, "h02.lance row", "checksum")
    assert _digests(d) == before and sorted(p.name for p in d.iterdir()) == files
    # the half-built run is left beside the block (never inside the DVC output) until the next run clears it
    staging = d.parent / ".b01.staging"
    assert staging.is_dir()
    assert loop.begin(d, {"done": True}) == d and not staging.exists()
    assert _digests(d) == before


def test_publish_swaps_and_begin_recovers_a_swap_cut_short(tmp_path):
    d = tmp_path / "b00"
    d.mkdir()
    (d / "meta.json").write_text("old")
    work = loop.begin(d, None)  # a fresh start over a non-empty folder builds beside it
    assert work == tmp_path / ".b00.staging" and (d / "meta.json").read_text() == "old"
    (work / "meta.json").write_text("new")
    loop.publish(work, d)
    assert (d / "meta.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["b00"]

    d.rename(tmp_path / ".b00.old")  # killed between publish's two renames
    (tmp_path / ".b00.staging").mkdir()
    assert loop.begin(d, {"step": 1}) == d
    assert (d / "meta.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["b00"]
    assert loop.begin(tmp_path / "b01", None) == tmp_path / "b01"  # nothing to keep: the folder itself

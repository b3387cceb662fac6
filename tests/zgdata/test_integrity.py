"""End-to-end integrity of boundary data: per-row checksums, read errors, missing and old-format datasets.

Damage is done to the real files on disk (bytes flipped inside a Lance data file, a data file
truncated, a dataset deleted), never through Lance, which keeps no checksum of its own.
"""

from __future__ import annotations

import shutil

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.helpers.assertions import assert_user_error, assert_user_error_alone
from tests.helpers.datasets import boundary_bits
from tests.helpers.projects import read_json, tree_sha256
from tests.helpers.runners import zg_main
from zgdata.capture_version import BOUNDARY_FORMAT_VERSION
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.store.reader import BoundaryDataset, BoundaryPair

# A train row among the first 16 (train.importance_rows: the trainer reads them before its first step)
# that verify's seeded sample of 4 does not include (each test asserts the latter from the report).
ROW = 9


def _row_bytes(path, row: int) -> bytes:
    col = lance.dataset(str(path)).take([row], columns=["hidden"]).column("hidden").combine_chunks()
    return col.values.to_numpy().tobytes()


def _flip_in_file(path, row: int, nbytes: int = 4096):
    """XOR ``nbytes`` in the middle of ``row``'s stored hidden bytes, found by their content in the data files.

    bf16 boundaries are stored uncompressed, so a row's 2*T*C bytes appear verbatim in exactly one file."""
    want = _row_bytes(path, row)
    hits = [(f, f.read_bytes().find(want)) for f in sorted((path / "data").glob("*.lance"))]
    hits = [(f, at) for f, at in hits if at >= 0]
    assert len(hits) == 1, f"row {row}'s bytes should appear in exactly one data file, found {hits}"
    f, at = hits[0]
    data = bytearray(f.read_bytes())
    assert data.count(want) == 1
    start = at + (len(want) - nbytes) // 2
    data[start : start + nbytes] = bytes(b ^ 0xFF for b in data[start : start + nbytes])
    f.write_bytes(bytes(data))
    assert _row_bytes(path, row) != want  # Lance reads the damaged bytes back without complaint


def test_checksum_column_is_xxh3_128_of_each_stored_row(tiny_built):
    import xxhash

    ds = lance.dataset(str(Layout(tiny_built).boundary("h02")))
    # format 4 names the algorithm; formats 2 and 3 (blake2b) are tests/zgdata/materialize/test_write_path.py's
    assert ds.schema.metadata[b"zg.format_version"] == str(BOUNDARY_FORMAT_VERSION + 2).encode()
    assert ds.schema.metadata[b"zg.checksum"] == b"xxh3_128"
    assert ds.schema.field("checksum").type == pa.binary(16)
    table = ds.to_table(columns=["hidden", "checksum"])
    values = table.column("hidden").combine_chunks().values.to_numpy().reshape(table.num_rows, -1)
    want = [xxhash.xxh3_128_digest(v.tobytes()) for v in values]
    assert table.column("checksum").to_pylist() == want and len(set(want)) == table.num_rows


def test_two_flipped_rows_are_named_in_the_callers_order_through_the_mapped_pages(tiny_project):
    path = Layout(tiny_project).boundary("h02")
    _flip_in_file(path, ROW)
    _flip_in_file(path, ROW + 3)
    ds = BoundaryDataset(path)
    assert ds._page_reader() is not None  # raw rows are read from the mapped pages, checked against stored digests
    with pytest.raises(ZgError, match=rf"row {ROW + 3} \(seq_id {ROW + 3}\).*\(and 1 more of the 4 rows read\)"):
        ds.take([1, ROW + 3, 2, ROW])
    assert ds.take([1, 2]).shape == (2, 64, 64)


def test_flipped_row_fails_verify_reader_and_training(tiny_project):
    layout = Layout(tiny_project)
    path = layout.boundary("h02")
    _flip_in_file(path, ROW)
    before = tree_sha256(layout.boundaries_dir)

    # the reader refuses the row on every read, and only that row
    ds = BoundaryDataset(path)
    with pytest.raises(ZgError, match=rf"h02.lance row {ROW} \(seq_id {ROW}\).*dvc checkout .*h02.lance"):
        ds.take([0, ROW, 20])
    assert ds.take([0, 20, 47]).shape == (3, 64, 64)

    for extra in ((), ("--lineage-only",)):
        res = zg_main("data", "verify", *extra, cwd=tiny_project, check=False)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert f"h02 row {ROW} (seq_id {ROW})" in " ".join(res.stderr.split())
        report = read_json(layout.partial_verify_report if extra else layout.verify_report)
        assert report["status"] == "fail"
        assert [(f["boundary"], f["check"], f["row"]) for f in report["failures"]] == [("h02", "checksum", ROW)]
        assert "dvc checkout" in report["failures"][0]["fix"]
        assert report["checksum_rows_checked"] == 3 * 56
        # the full verify recomputed its sample with the teacher bit for bit: the sample missed the row
        assert (
            report["checked_seq_ids"] == []
            if extra
            else (len(report["checked_seq_ids"]) == 4 and ROW not in report["checked_seq_ids"])
        )

    # the cached trainer reads through the reader: one error line, and no block output
    res = zg_main("train", "block", "b00", cwd=tiny_project, check=False)
    assert_user_error(
        res,
        f"data/boundaries/h02.lance row {ROW} (seq_id {ROW})",
        "checksum",
        "dvc checkout --force data/boundaries/h02.lance",
        "dvc repro -f materialize",
    )
    assert [p for p in layout.block_dir("b00").rglob("*") if p.is_file()] == []
    assert not layout.block_metrics("b00").exists() and not layout.block_loss_curve("b00").exists()
    assert tree_sha256(layout.boundaries_dir) == before


def _truncate_data_file(path):
    f = max((path / "data").glob("*.lance"), key=lambda p: p.stat().st_size)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


@pytest.mark.parametrize("name, command", [("h02", ("data", "verify")), ("tokens", ("data", "inspect"))])
def test_truncated_data_file_is_one_line_error(tiny_project, name, command):
    layout = Layout(tiny_project)
    path = layout.tokens if name == "tokens" else layout.boundary(name)
    _truncate_data_file(path)
    rel = str(path.relative_to(tiny_project))
    res = zg_main(*command, cwd=tiny_project, check=False)
    line = assert_user_error_alone(
        res,
        rel,
        "truncated",
        f"dvc checkout --force {rel}",
        "dvc repro -f " + ("tokens" if name == "tokens" else "materialize"),
    )
    assert "h00" not in line and "h04" not in line


def test_reads_after_open_name_the_dataset(tiny_project):
    """A data file damaged after the dataset was opened: take and the batch iterator both name it."""
    layout = Layout(tiny_project)
    pair = BoundaryPair(layout.boundary("h00"), layout.boundary("h02"))
    for f in (layout.boundary("h02") / "data").glob("*.lance"):
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ZgError, match=r"cannot read .*h02.lance: a data file is truncated.*dvc checkout") as e:
        pair.take([0, 1])
    assert "\n" not in str(e.value)
    with pytest.raises(ZgError, match=r"h02.lance"):
        next(pair.batches("train", start_step=0, steps=2, batch_size=4, seed=0))


def test_verify_counts_checksums_and_fails_on_a_missing_boundary(tiny_project):
    layout = Layout(tiny_project)
    res = zg_main("data", "verify", cwd=tiny_project)
    assert "168 rows' checksums ok" in " ".join(res.stderr.split())
    report = read_json(layout.verify_report)
    assert report["status"] == "ok" and report["checksum_rows_checked"] == 168 and report["missing"] == []
    assert {n: b["checksum_rows"] for n, b in report["boundaries"].items()} == {"h00": 56, "h02": 56, "h04": 56}

    shutil.rmtree(layout.boundary("h02"))
    res = zg_main("data", "verify", cwd=tiny_project, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "h02 (data/boundaries/h02.lance), which partition.boundaries needs, is missing" in " ".join(
        res.stderr.split()
    )
    report = read_json(layout.verify_report)
    assert [(f["boundary"], f["check"]) for f in report["failures"]] == [("h02", "missing")]
    assert "dvc pull data/boundaries/h02.lance" in report["failures"][0]["fix"]
    assert sorted(report["boundaries"]) == ["h00", "h04"] and report["checksum_rows_checked"] == 112
    # --lineage-only checks what is present (a team may pull one block's pair) and lists what is not
    zg_main("data", "verify", "--lineage-only", cwd=tiny_project)
    assert read_json(layout.partial_verify_report)["missing"] == ["h02"]


def _rewrite(path, table: pa.Table, meta: dict, drop_meta: tuple = ()) -> None:
    """Replace the dataset at ``path`` with ``table`` under ``meta`` (less the ``drop_meta`` keys)."""
    shutil.rmtree(path)
    lance.write_dataset(
        table.replace_schema_metadata({k: v for k, v in meta.items() if k.decode() not in drop_meta}), str(path)
    )


def test_old_format_is_refused_and_rematerialized(tiny_built, tiny_project):
    layout = Layout(tiny_project)
    path = layout.boundary("h02")
    full = lance.dataset(str(path)).to_table()
    no_checksum = full.drop_columns(["checksum"])

    # the previous format: no checksum column, no format version
    meta = full.schema.metadata
    _rewrite(path, no_checksum, meta, drop_meta=("zg.format_version",))
    res = zg_main("data", "verify", "--lineage-only", cwd=tiny_project, check=False)
    assert_user_error_alone(
        res, "data/boundaries/h02.lance", "before boundary format 2", "rematerialize", "dvc repro -f materialize"
    )
    # format 2 claimed without the column, or the column under an older version: refused too
    _rewrite(path, no_checksum, meta)
    with pytest.raises(ZgError, match="no valid `checksum` column.*rematerialize"):
        BoundaryDataset(path)
    _rewrite(path, full, {**meta, b"zg.format_version": b"1"})
    with pytest.raises(ZgError, match="boundary format 1, but this zg reads formats 2, 3, 4.*rematerialize"):
        BoundaryDataset(path)

    # materialize does not take it for complete: it rewrites the dataset, bit for bit as before
    zg_main("data", "materialize", cwd=tiny_project)
    zg_main("data", "verify", "--lineage-only", cwd=tiny_project)
    want, got = boundary_bits(tiny_built), boundary_bits(tiny_project)
    assert all(torch.equal(got[n]["bits"], want[n]["bits"]) for n in want)
    assert lance.dataset(str(path)).schema.metadata[b"zg.format_version"] == b"4"
    assert np.array_equal(
        lance.dataset(str(path)).to_table(columns=["checksum"]).column("checksum").to_numpy(zero_copy_only=False),
        full.column("checksum").to_numpy(zero_copy_only=False),
    )


def test_verify_scan_reads_a_raw_boundary_through_its_maps_and_finds_a_flipped_row(tiny_project):
    """`zg data verify`'s scan of a raw boundary reads the mapped pages (not Lance's stream) in runs of any size,
    and reports a row whose bytes were flipped on disk with its seq_id; the other rows pass."""
    from zgdata.store.integrity import scan_checksums

    path = Layout(tiny_project).boundary("h02")
    _flip_in_file(path, ROW)
    b = BoundaryDataset(path)
    assert b._page_reader() is not None  # the maps, whose probe rows (0, n/2, n-1) are not the flipped one
    for batch in (b.row_bytes, 5 * b.row_bytes, 16 << 20):
        assert b.scan(batch) == (56, [(ROW, int(b.seq_ids[ROW]))])
    assert scan_checksums(b.ds, b.row_bytes, algo=b.checksum) == (56, [(ROW, int(b.seq_ids[ROW]))])  # Lance agrees


def test_checksum_column_built_from_one_buffer_is_the_converted_digests():
    """``checksum_array`` joins the digests into one buffer (converting each bytes object held the GIL): the same
    Arrow array as converting them, with no null buffer, empty included."""
    import xxhash

    from zgdata.store.integrity import checksum_array

    rows = np.random.default_rng(0).integers(0, 1 << 16, (5, 300), dtype=np.uint16)  # bf16 bits, as materialize has
    col = checksum_array(rows, algo="xxh3_128")
    want = pa.array([xxhash.xxh3_128_digest(r.tobytes()) for r in rows], type=pa.binary(16))
    assert col.equals(want) and col.buffers()[0] is None and col.null_count == 0
    empty = checksum_array(rows[:0], algo="xxh3_128")
    assert empty.type == pa.binary(16) and len(empty) == 0


def test_xxh3_row_checksum_lets_go_of_the_gil():
    """While one thread hashes rows, another runs Python: the encoding pool's threads hash on every core
    (xxhash 3's one-shot digest held the GIL; pyproject.toml asks for xxhash 4).

    No timing: with the switch interval at 30 s the interpreter never takes the GIL from a thread, so the main
    thread (woken by the event) runs only where the hashing thread lets go of the GIL itself. If the hash held
    it, the hashing thread would finish all its rounds before the main thread could set ``seen``."""
    import sys
    import threading

    from zgdata.store.integrity import row_checksum

    buf, rounds = np.ones(8 << 20, dtype=np.uint8), 2000  # a second or more of hashing if the GIL were held
    started, state = threading.Event(), {"seen": False, "hashed": 0}
    row_checksum(buf[:16], algo="xxh3_128")  # imports xxhash here: an import's file reads would let go of the GIL

    def hasher():
        started.set()
        while not state["seen"] and state["hashed"] < rounds:
            row_checksum(buf, algo="xxh3_128")
            state["hashed"] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        t = threading.Thread(target=hasher)
        t.start()
        started.wait()
        state["seen"] = True
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert state["hashed"] < rounds, "the main thread ran only after every round: xxh3 held the GIL"

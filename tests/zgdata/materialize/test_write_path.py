"""The parallel write path: the bytes on disk do not depend on the thread count, a killed threaded run resumes to
the same bytes, the row checksum is recorded (xxh3-128 now, blake2b in datasets written before it, which keep
reading and verifying), and the checksum is no part of lineage."""

from __future__ import annotations

import hashlib
import json
import shutil
from fractions import Fraction

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from tests.helpers.copies import deferred_to_host, one_behind
from tests.helpers.datasets import data_file_digest, kill_after_first_commit_then_resume, read_boundaries
from tests.helpers.projects import edit_params
from tests.helpers.runners import zg_main
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.store import integrity
from zgdata.store.lance_io import schema_meta
from zgdata.store.reader import BoundaryDataset

NAMES = ["h00", "h02", "h04"]


def _materialize(root, **edits) -> None:
    edit_params(root, materialize=edits)
    shutil.rmtree(root / "data" / "boundaries", ignore_errors=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    cfg, part = section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")
    assert not materialize(cfg, part, layout=Layout(root)).skipped


def _data_files(root) -> dict[str, tuple]:
    """Each boundary's data files, in the dataset's fragment order, as digests of their bytes (names are random;
    ``data_file_digest`` leaves out only the schema buffer, which Lance writes in hash order even for one thread),
    with the schema and its metadata, compared as a map."""
    out = {}
    for n in NAMES:
        path = Layout(root).boundary(n)
        ds = lance.dataset(str(path))
        files = [data_file_digest(path / "data" / d.path) for f in ds.get_fragments() for d in f.data_files()]
        out[n] = (files, ds.schema.remove_metadata(), dict(ds.schema.metadata))
    return out


@pytest.mark.parametrize("codec", ["raw", "zstd_fast"])
def test_thread_counts_write_the_same_bytes(tiny_project, tmp_path, codec):
    """One encoding thread against three (and one capture per batch as today): every data file hashes the same."""
    other = shutil.copytree(tiny_project, tmp_path / "other", symlinks=True)
    _materialize(tiny_project, codec=codec, writer_threads=1)
    _materialize(other, codec=codec, writer_threads=3)
    one, three = _data_files(tiny_project), _data_files(other)
    assert all(one[n][0] for n in NAMES) and one == three
    a, b = read_boundaries(tiny_project, NAMES), read_boundaries(other, NAMES)
    for n in NAMES:
        assert torch.equal(a[n][0], b[n][0]) and a[n][1:] == b[n][1:], n


def test_copies_waited_for_one_batch_behind_write_the_same_bytes(tiny_project, tmp_path, monkeypatch):
    """Materialize with every copy to the host under way until the next batch is launched (as on a GPU,
    zgdata/core/host_copy.py): each batch waits once, after the next launch, and every data file hashes the same as
    a run whose copies are done at once (the CPU's)."""
    from zgdata.core import host_copy

    other = shutil.copytree(tiny_project, tmp_path / "other", symlinks=True)
    _materialize(tiny_project, codec="zstd_fast", batch_size=5)
    log: list = []
    monkeypatch.setattr(host_copy, "to_host", deferred_to_host(log))  # buffers filled only when waited for
    _materialize(other, codec="zstd_fast", batch_size=5)
    assert log == one_behind(-(-56 // 5))  # the tiny profile's 56 rows in batches of 5
    assert _data_files(tiny_project) == _data_files(other)


@pytest.mark.long
@pytest.mark.parametrize("codec", ["zstd_fast", "int8"])
def test_killed_threaded_run_resumes_to_the_same_bytes(tiny_project, tmp_path, codec):
    """kill -9 after a journaled commit of a run with 2 encoding threads; its resume writes the data files an
    uninterrupted one-thread run writes (and, quantized, the same metadata: stats and measured error)."""
    root, want = tiny_project, shutil.copytree(tiny_project, tmp_path / "want", symlinks=True)
    _materialize(want, codec=codec, commit_rows=8, writer_threads=1)
    edit_params(root, materialize={"codec": codec, "commit_rows": 8, "writer_threads": 2})
    shutil.rmtree(root / "data" / "boundaries")
    kill_after_first_commit_then_resume(root)
    assert _data_files(root) == _data_files(want)


def test_blake2b_datasets_still_read_and_verify(tiny_project, tmp_path, monkeypatch):
    """A dataset written as zg wrote it before xxh3 (format 3, no zg.checksum, blake2b rows) reads, verifies and
    inspects as blake2b; its fingerprint and values are those of an xxh3 dataset: the checksum is not lineage."""
    new = shutil.copytree(tiny_project, tmp_path / "new", symlinks=True)
    _materialize(new, codec="zstd")
    monkeypatch.setattr(integrity, "WRITE_CHECKSUM", "blake2b")
    _materialize(tiny_project, codec="zstd")
    monkeypatch.undo()

    path = Layout(tiny_project).boundary("h02")
    meta = schema_meta(lance.dataset(str(path)).schema)
    assert meta["format_version"] == 3 and "checksum" not in meta  # exactly the former metadata
    table = lance.dataset(str(path)).to_table(columns=["checksum"])
    b = BoundaryDataset(path)
    bits = b.take(np.arange(len(b.seq_ids))).view(torch.int16).numpy()
    want = [hashlib.blake2b(r.tobytes(), digest_size=16).digest() for r in bits.reshape(len(bits), -1)]
    assert table.column("checksum").to_pylist() == want

    zg_main("data", "verify", "--lineage-only", cwd=tiny_project)  # every row's blake2b checked
    infos = {i["name"]: i for i in json.loads(zg_main("data", "inspect", "--json", cwd=tiny_project).stdout)}
    assert infos["h02"]["checksum"] == "blake2b" and infos["h02"]["format_version"] == 3
    new_infos = {i["name"]: i for i in json.loads(zg_main("data", "inspect", "--json", cwd=new).stdout)}
    assert new_infos["h02"]["checksum"] == "xxh3_128" and new_infos["h02"]["format_version"] == 4

    old, cur = read_boundaries(tiny_project, NAMES), read_boundaries(new, NAMES)
    for n in NAMES:  # same values, same fingerprint, same stats: only the row checksum differs
        assert torch.equal(old[n][0], cur[n][0]) and old[n][1:] == cur[n][1:], n

    # and its rows are really checked with blake2b: one row's stored digest changed is caught by a read and a scan
    whole = lance.dataset(str(path)).to_table()
    sums = whole.column("checksum").to_pylist()
    sums[1] = bytes(b ^ 1 for b in sums[1])
    bad = tmp_path / "bad" / "h02.lance"
    col = whole.schema.get_field_index("checksum")
    lance.write_dataset(whole.set_column(col, whole.schema.field(col), pa.array(sums, whole.column(col).type)), bad)
    damaged = BoundaryDataset(bad)
    assert damaged.checksum == "blake2b" and damaged.scan()[1] == [(1, int(damaged.seq_ids[1]))]
    damaged.take([0, 2])  # the other rows still read
    with pytest.raises(ZgError, match="row 1"):
        damaged.take([1])


def test_a_flipped_byte_fails_the_checksum_of_either_algorithm(tiny_project):
    """Both algorithms catch one changed value (verify reads every row); xxh3 is not weaker at what it guards."""
    rows = np.random.default_rng(0).integers(0, 2**16, (3, 4096), dtype=np.uint16)
    for algo in integrity.CHECKSUMS:
        sums = [integrity.row_checksum(r, algo=algo) for r in rows]
        flipped = rows.copy()
        flipped[1, 17] ^= 1
        again = [integrity.row_checksum(r, algo=algo) for r in flipped]
        assert again[0] == sums[0] and again[2] == sums[2] and again[1] != sums[1], algo


def test_large_rows_write_a_page_per_batch_that_the_raw_reader_maps(tmp_path):
    """Batches of a MiB or more per boundary become one Lance page each (``staging.CACHE_BYTES_PER_COLUMN``), the
    small columns stay in one page, and the raw reader maps those pages (one map per file) to Lance's own values."""
    from lance.file import LanceFileReader

    from zgdata.materialize.staging import Journal, boundary_schema, finalize
    from zgdata.materialize.writer import Writer
    from zgdata.store.codec import codec_meta, format_of

    seq_len, hidden, batch, batches = 64, 4096, 4, 3  # 2 MiB of bf16 per batch
    lineage = {"teacher_sha256": "t", "tokenizer_sha256": "t", "tokens_fingerprint": "t", "layer": 1}
    meta = {
        "kind": "boundary",
        "name": "h01",
        "layer": 1,
        "fingerprint": "f",
        "lineage": lineage,
        "seq_len": seq_len,
        "hidden": hidden,
        "rows": {"train": batch * batches},
        "format_version": format_of("raw", integrity.WRITE_CHECKSUM),
        "codec": codec_meta("raw"),
        "checksum": integrity.WRITE_CHECKSUM,
        "complete": False,
    }
    stage = tmp_path / "stage"
    stage.mkdir()
    journal = Journal(stage / "journal.json")
    schemas = {"h01": boundary_schema(meta, seq_len, hidden, "bfloat16", "raw")}
    w = Writer(
        stage=stage,
        names=["h01"],
        schemas=schemas,
        journal=journal,
        cfg=MaterializeConfig(codec="raw", writer_threads=2),
        total_rows=batch * batches,
        seq_len=seq_len,
        hidden=hidden,
        checksum=integrity.WRITE_CHECKSUM,
    )
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(batch, seq_len, hidden, generator=g).to(torch.bfloat16) for _ in range(batches)]
    w.start()
    for i, x in enumerate(xs):
        w.q.put((np.arange(i * batch, (i + 1) * batch), ["train"] * batch, {"h01": x}))
    w.q.put(None)
    w.join()
    assert w.error is None
    final = tmp_path / "h01.lance"
    n = batch * batches
    finalize(stage, ["h01"], journal, {"h01": final}, n_rows=n, row_bytes=seq_len * hidden * 2, file_mb=1024)

    (f,) = (final / "data").iterdir()
    pages = {
        c: len(m.pages)
        for c, m in zip(["seq_id", "split", "hidden", "checksum"], LanceFileReader(str(f)).metadata().columns)
    }
    assert pages == {"seq_id": 1, "split": 1, "hidden": batches, "checksum": 1}
    b = BoundaryDataset(final)
    read = b._page_reader()
    assert read is not None  # the mapped pages, not a fallback to Lance's take
    rows = np.array([5, 0, 11, 4, 7])
    assert np.array_equal(read(rows), b.decode(b.ds.take(rows, columns=["hidden"])))
    want = torch.cat(xs)[torch.as_tensor(rows)]
    assert torch.equal(b.take(rows).view(torch.int16), want.view(torch.int16))  # checked against the checksums


def test_encoding_threads_run_their_torch_ops_alone_and_the_stats_keep_their_bits():
    """Each encoding thread runs its torch ops (the stats) on that thread alone (``runtime.serial_torch_thread``):
    an OpenMP team per pool thread would oversubscribe the cores. The calling thread and threads started later keep
    the process's count, and a batch's stats are the same bits as the caller's, at sizes torch splits over threads: at 100,000 channels a
    row of 3 tokens is one chunk, a row of 5 is chunks of 2 and 3 (the fifth token joins the last chunk rather than
    be reduced alone), a lone token is reduced as two; 24 batches of 5 tokens, since a chunk of one token disagrees
    with the caller in about a quarter of them."""
    import threading

    from zgdata.materialize.encode import Encoder
    from zgdata.materialize.staging import boundary_schema
    from zgdata.materialize.stats import batch_stats

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    enc = Encoder(
        threads=2,
        schema=boundary_schema(None, 512, 576, "bfloat16", "raw"),
        storage_dtype="bfloat16",
        codec="raw",
        checksum="xxh3_128",
    )
    try:
        assert [f.result() for f in [enc.pool.submit(torch.get_num_threads) for _ in range(6)]] == [1] * 6
        later = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert (torch.get_num_threads(), later) == (2, [2])
        g = torch.Generator().manual_seed(5)
        for shape in [(4, 512, 576), (1, 3, 100_000), *[(1, 5, 100_000)] * 24, (1, 1, 100_000), (2, 7, 5)]:
            x = (torch.randn(*shape, generator=g) * torch.exp(torch.randn(shape[-1], generator=g))).to(torch.bfloat16)
            assert enc.pool.submit(batch_stats, x).result() == batch_stats(x), shape
    finally:
        enc.close()
        torch.set_num_threads(before)


def test_stats_reuse_one_chunk_buffer_per_thread_and_leave_a_float32_batch_as_it_was():
    """``batch_stats`` copies the tokens into this thread's float32 chunk buffer (a fresh copy per row faulted its
    pages in every time); every batch of the same width reuses that buffer, and a float32 batch is never squared in
    place."""
    from zgdata.materialize import stats

    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 16, 24, generator=g)
    kept = x.clone()
    first = stats.batch_stats(x)
    ptr = stats._SCRATCH.chunk.data_ptr()
    again = stats.batch_stats(x.to(torch.bfloat16).float())
    assert stats._SCRATCH.chunk.data_ptr() == ptr
    assert torch.equal(x, kept)
    rms = x.pow(2).mean(-1).sqrt().reshape(-1)
    assert first["tokens"] == again["tokens"] == 48 and first["absmax"] == float(x.abs().max())
    assert stats.summary(first)["mean_rms"] == float(sum(Fraction(v) for v in rms.tolist()) / 48)


def test_an_encode_error_with_the_queue_full_fails_the_run_instead_of_hanging(tiny_project, monkeypatch):
    """The first batch's encoding fails while the next batch's boundaries are still encoding and the forward,
    ahead, is blocked on the full queue: the run raises that error once the writer has dropped its work (it used to
    wait forever to hand the stopped writer its end-of-input), leaves no thread, publishes nothing, and a rerun
    completes."""
    import threading
    import time

    from zgdata.materialize import encode, forward  # forward: the teacher pass materialize runs

    real_encode, real_capture = encode.encode_batch, forward.capture_rows
    forwards, first_batch, encoding = [], [], threading.Event()

    def counting(*args, **kw):
        forwards.append(1)
        return real_capture(*args, **kw)

    def failing(x, rows, splits, **kw):
        if rows[0] != 0:
            encoding.set()
            time.sleep(3)  # still encoding when the forward sees the failure
            return real_encode(x, rows, splits, **kw)
        first_batch.append(1)
        if len(first_batch) > 1:
            return real_encode(x, rows, splits, **kw)
        # batch 0's first boundary fails once the writer holds batches 0 and 1 (queue_batches 1), the queue holds
        # batch 2, the forward is blocked on batch 3, and the other encoding thread has started on batch 1
        while len(forwards) < 4 or not encoding.is_set():
            time.sleep(0.01)
        time.sleep(0.2)
        raise RuntimeError("injected encode failure")

    monkeypatch.setattr(encode, "encode_batch", failing)
    monkeypatch.setattr(forward, "capture_rows", counting)
    outcome = {}

    def run():
        try:
            _materialize(tiny_project, writer_threads=2, queue_batches=1, batch_size=4)
        except BaseException as e:
            outcome["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=300)  # a guard against the hang under test, not a duration
    assert not t.is_alive(), "materialize hung after its writer failed"
    assert "injected encode failure" in str(outcome.get("error")), outcome
    assert not any(t.name.startswith("zg-encode") for t in threading.enumerate()), "an encoding thread was left"
    assert not Layout(tiny_project).boundary("h00").exists()

    monkeypatch.setattr(encode, "encode_batch", real_encode)
    _materialize(tiny_project)  # the rerun completes (nothing was published to remove)
    assert read_boundaries(tiny_project, NAMES)["h04"][0].shape[0] > 4


def test_a_shard_that_would_leave_a_gap_is_never_committed(tmp_path):
    """Commit groups (or shards) are committed in row order: a shard of rows 8-16 on a journal with no row done
    would leave rows 0-7 missing, so ``commit`` refuses it before anything is committed or journaled."""
    from zgdata.materialize.staging import Journal, commit

    journal = Journal(tmp_path / "journal.json")
    shard = {"lo": 8, "hi": 16, "fragments": {}, "stats": {}}
    with pytest.raises(RuntimeError, match=r"shard 8-16 committed after row 0"):
        commit(tmp_path, [], {}, journal, shard, 16)
    assert journal.state["rows_done"] == 0 and "shards" not in journal.state
    assert not (tmp_path / "journal.json").exists()

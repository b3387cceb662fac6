"""The ``zstd_blob`` codec: zstd_fast's two planes (the compressed high bytes, the low bytes), each a Lance blob per
row in packed sidecars. The same values, fingerprint and stats as ``raw``, the same frames as ``zstd_fast``; the
bytes do not depend on the thread count, a killed run or a sharded one; the reader maps both planes and falls back to
Lance's own read; a flipped byte in either plane, or a missing sidecar, is reported, never trained on."""

from __future__ import annotations

import json
import shutil

import lance
import numpy as np
import pytest
import torch

from tests.helpers.datasets import kill_after_first_commit_then_resume, read_boundaries
from tests.helpers.projects import edit_params
from tests.helpers.runners import zg_main
from tests.zgdata.materialize.test_blob_codec import (
    NAMES,
    _files,
    _materialize,
    _raw,
    assert_values_are,
    flip_and_check_row_3,
)
from zgdata.layout import Layout
from zgdata.store import blobs
from zgdata.store.decode import flat_values
from zgdata.store.lance_io import schema_meta
from zgdata.store.reader import BoundaryDataset


def _planes(path) -> tuple[list[bytes], list[bytes]]:
    """Each row's (compressed high bytes, low bytes) through Lance's own read of the two blob columns."""
    ds = lance.dataset(str(path))
    rows = list(range(ds.count_rows()))
    out = []
    for col in ("hidden_hi", "hidden_lo"):
        got = []
        for b in ds.take_blobs(col, indices=rows):
            with b:
                got.append(b.read())
        out.append(got)
    return out[0], out[1]


def test_zstd_blob_rows_are_zstd_fast_planes_packed_in_sidecars(tiny_project, tmp_path, monkeypatch):
    """The same bits, fingerprint and stats as raw; format 5, checksum named; each row's high-byte frame is
    zstd_fast's own frame and its low bytes zstd_fast's low bytes, both packed in the sidecars; `zg data inspect`
    and `zg data verify` read it; the reader maps both planes, and with the sidecar names unknown (another Lance
    version) reads the same rows through Lance's take_blobs, with and without the decoded cache."""
    want = _raw(tiny_project)
    fast = shutil.copytree(tiny_project, tmp_path / "fast", symlinks=True)
    _materialize(fast, codec="zstd_fast")
    _materialize(tiny_project, codec="zstd_blob", writer_threads=2, commit_rows=16)  # several groups, compacted
    assert_values_are(tiny_project, want)

    path = Layout(tiny_project).boundary("h02")
    ds = lance.dataset(str(path))
    meta = schema_meta(ds.schema)
    assert meta["format_version"] == 5 and meta["checksum"] == "xxh3_128"
    assert meta["codec"]["name"] == "zstd_blob" and meta["codec"]["layout"] == "blob"
    assert len(ds.get_fragments()) == 1  # the commit groups compacted, blobs and all
    hi, lo = _planes(path)
    fast_ds = lance.dataset(str(Layout(fast).boundary("h02")))
    fast_hi = fast_ds.to_table(columns=["hidden_hi"]).column("hidden_hi").to_pylist()
    fast_lo = flat_values(fast_ds.to_table(columns=["hidden_lo"]).column("hidden_lo"), len(lo[0]))
    assert hi == fast_hi and [np.frombuffer(x, np.uint8).tolist() for x in lo] == fast_lo.tolist()
    for col in ("hidden_hi", "hidden_lo"):
        d = ds.to_table(columns=[col]).column(col).combine_chunks()
        assert set(d.field("kind").to_pylist()) == {blobs.PACKED}, col
    sidecars = [f for s in blobs.sidecar_dirs(ds, path) for f in s.iterdir()]
    assert sum(f.stat().st_size for f in sidecars) == sum(map(len, hi)) + sum(map(len, lo))

    infos = {i["name"]: i for i in json.loads(zg_main("data", "inspect", "--json", cwd=tiny_project).stdout)}
    assert infos["h02"]["codec"] == "zstd_blob" and infos["h02"]["format_version"] == 5
    zg_main("data", "verify", "--lineage-only", cwd=tiny_project)  # every row's checksum, decoded from sidecars

    b = BoundaryDataset(path)
    assert [f.__name__ for f in b._blob_planes()] == ["read", "read"]  # both planes mapped
    rows = np.array([5, 0, 55, 17, 17])
    mapped = b.take(rows).view(torch.int16)
    assert torch.equal(mapped, want["h02"][0][rows])
    monkeypatch.setattr(blobs, "_sidecar_name", lambda folder, blob_id: None)
    for recheck in (False, True):  # the decoded cache's fill, and a read that decodes every time
        other = BoundaryDataset(path, recheck=recheck)
        assert [f.__name__ for f in other._blob_planes()] == ["through_lance", "through_lance"]
        assert torch.equal(other.take(rows).view(torch.int16), mapped), recheck


def test_thread_counts_and_a_killed_run_write_the_same_zstd_blob_bytes(tiny_project, tmp_path):
    """One encoding thread against three, and a run killed (kill -9) after its first journaled commit and resumed:
    every data file and every sidecar hashes the same, and nothing is left over beside them."""
    other = shutil.copytree(tiny_project, tmp_path / "other", symlinks=True)
    killed = shutil.copytree(tiny_project, tmp_path / "killed", symlinks=True)
    _materialize(tiny_project, codec="zstd_blob", writer_threads=1, commit_rows=8)
    _materialize(other, codec="zstd_blob", writer_threads=3, commit_rows=8)
    one = _files(tiny_project)
    assert all(sidecar for n in NAMES for _, sidecar in one[n]) and one == _files(other)

    edit_params(killed, materialize={"codec": "zstd_blob", "commit_rows": 8, "writer_threads": 2})
    shutil.rmtree(killed / "data" / "boundaries")
    kill_after_first_commit_then_resume(killed)
    assert _files(killed) == one
    for n in NAMES:
        path = Layout(killed).boundary(n)
        ds = lance.dataset(str(path))
        on_disk = sorted(p.name for p in (path / "data").iterdir())
        listed = sorted(d.path for f in ds.get_fragments() for d in f.data_files())
        assert on_disk == sorted([*listed, *(p.name for p in blobs.sidecar_dirs(ds, path))]), n


def test_sharded_zstd_blob_run_equals_one_process(tiny_project, tmp_path, ray_session):
    """Two Ray workers, each streaming its shard's sidecars: the published values, fingerprint and stats are one
    process's, compacted into one data file, and every row's frame and low bytes are one process's (the files
    themselves may differ: Lance's compaction of the shards packs the two planes' blobs in its own order)."""
    one = shutil.copytree(tiny_project, tmp_path / "one", symlinks=True)
    _materialize(one, codec="zstd_blob")
    r = _materialize(tiny_project, codec="zstd_blob", workers=2)
    got = assert_values_are(tiny_project, read_boundaries(one, NAMES))
    assert r.stats == {n: got[n][2] for n in NAMES}
    for n in NAMES:
        path = Layout(tiny_project).boundary(n)
        assert len(lance.dataset(str(path)).get_fragments()) == 1, n
        assert _planes(path) == _planes(Layout(one).boundary(n)), n


@pytest.mark.parametrize(
    "plane, refused",
    [("hidden_hi", "rows 2-3.*the compressed high bytes .* do not decode"), ("hidden_lo", "row 3 .*does not match")],
)
def test_a_flipped_byte_in_either_plane_or_a_missing_sidecar_is_reported(tiny_project, plane, refused):
    """One changed byte in row 3's compressed high bytes (the frame no longer decodes) or in its low bytes (its
    checksum fails): verify names the row and exits non-zero, and a read refuses the row. A data file's sidecar
    folder gone: opening the dataset says so and how to recover."""
    _materialize(tiny_project, codec="zstd_blob")
    path = Layout(tiny_project).boundary("h02")
    ds = lance.dataset(str(path))
    d = ds.to_table(columns=[plane]).column(plane).combine_chunks()
    pos, blob_id = int(d.field("position")[3].as_py()), int(d.field("blob_id")[3].as_py())
    (folder,) = blobs.sidecar_dirs(ds, path)
    flip_and_check_row_3(tiny_project, path, blobs._sidecar_name(folder, blob_id), pos + 40, refused)


def test_several_sidecars_and_a_wrong_mapping_still_read_raw_rows(tiny_project, monkeypatch):
    """Lance may pack a data file's blobs into several sidecars (here a new one every 3 rows of low bytes, as
    Lance's default does every GiB): both planes still map, and rows read in any order are raw's. A mapping that
    points each row at its neighbour's bytes fails the probe against Lance's take_blobs, and the reads go through
    Lance, to the same rows."""
    from zgdata.store import codec

    want = _raw(tiny_project)
    b = BoundaryDataset(Layout(tiny_project).boundary("h02"))
    monkeypatch.setattr(codec, "BLOB_PACK_MAX", 3 * b.seq_len * b.hidden)
    _materialize(tiny_project, codec="zstd_blob")
    path = Layout(tiny_project).boundary("h02")
    assert min(len(list(s.iterdir())) for s in blobs.sidecar_dirs(lance.dataset(str(path)), path)) > 1
    rows = np.random.default_rng(3).permutation(len(b.seq_ids))
    b = BoundaryDataset(path, recheck=True)
    assert [f.__name__ for f in b._blob_planes()] == ["read", "read"]
    assert torch.equal(b.take(rows).view(torch.int16), want["h02"][0][rows])

    mapped = blobs._mapped

    def shifted(ds, path, column, row_bytes):
        maps, which, offsets, sizes = mapped(ds, path, column, row_bytes)
        return maps, np.roll(which, 1), np.roll(offsets, 1), np.roll(sizes, 1)

    monkeypatch.setattr(blobs, "_mapped", shifted)
    b = BoundaryDataset(path, recheck=True)
    assert [f.__name__ for f in b._blob_planes()] == ["through_lance", "through_lance"]
    assert torch.equal(b.take(rows).view(torch.int16), want["h02"][0][rows])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_zstd_blob_planes_decode_to_the_stored_bits_in_either_storage_dtype(dtype):
    """The record batch's two blob columns hold, per row, zstd_fast's frame of the high bytes and the other bytes
    (one for bf16, three for float32); decoded from those planes they are the stored bits; without the planes (a
    table of descriptors) decode refuses."""
    from zgdata.store import codec

    name = str(dtype).removeprefix("torch.")
    x = torch.randn(3, 16, 24, generator=torch.Generator().manual_seed(1)).to(dtype)
    (hi_col, lo_col), bits = codec.hidden_arrays(x, name, "zstd_blob")
    hi = [hi_col.storage.field(0)[i].as_buffer() for i in range(3)]
    lo = [np.frombuffer(lo_col.storage.field(0)[i].as_buffer(), np.uint8) for i in range(3)]
    assert {len(r) for r in lo} == {16 * 24 * (x.element_size() - 1)}
    assert np.array_equal(codec.decode_rows(None, "zstd_blob", name, 16, 24, hi=hi, lo=lo), bits)
    with pytest.raises(ValueError, match="sidecar"):
        codec.decode_rows(None, "zstd_blob", name, 16, 24)

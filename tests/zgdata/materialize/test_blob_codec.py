"""The ``blob`` codec: raw's bits, each row a Lance blob packed in sidecar files. The same values, fingerprint and
stats as ``raw``; the bytes do not depend on the thread count, a sharded run or a killed one; the reader maps the
sidecars and falls back to Lance's own read; a flipped or missing sidecar is reported, never trained on."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import lance
import numpy as np
import pytest
import torch
import yaml

from tests.helpers.datasets import data_file_digest, kill_after_first_commit_then_resume, read_boundaries
from tests.helpers.projects import edit_params
from tests.helpers.runners import zg_main
from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize
from zgdata.store import blobs
from zgdata.store.lance_io import schema_meta
from zgdata.store.reader import BoundaryDataset

NAMES = ["h00", "h02", "h04"]


def _materialize(root, **edits):
    edit_params(root, materialize=edits)
    shutil.rmtree(root / "data" / "boundaries", ignore_errors=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    cfg, part = section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")
    r = materialize(cfg, part, layout=Layout(root))
    assert not r.skipped
    return r


def _files(root) -> dict[str, list]:
    """Each boundary's data files in fragment order, each with the sha256 of every file in its sidecar folder."""
    out = {}
    for n in NAMES:
        path = Layout(root).boundary(n)
        ds = lance.dataset(str(path))
        out[n] = [
            (
                data_file_digest(path / "data" / d.path),
                [hashlib.sha256(b.read_bytes()).hexdigest() for b in sorted(blobs.sidecar_dirs(ds, path)[i].iterdir())],
            )
            for i, d in enumerate(x for f in ds.get_fragments() for x in f.data_files())
        ]
    return out


def assert_values_are(root, want: dict) -> dict:
    """ROOT's boundaries read through zg's reader (every row checked) hold ``want``'s bits, fingerprints and stats."""
    got = read_boundaries(root, NAMES)
    for n in NAMES:
        assert torch.equal(want[n][0], got[n][0]) and want[n][1:] == got[n][1:], n
    return got


def _raw(root) -> dict:
    """The project's boundaries as the tiny profile built them (codec raw), read through zg's reader."""
    assert schema_meta(lance.dataset(str(Layout(root).boundary("h02"))).schema)["codec"] == {"name": "raw"}
    return read_boundaries(root, NAMES)


def test_blob_rows_are_raw_rows_packed_in_sidecars(tiny_project, monkeypatch):
    """The same bits, fingerprint and stats as raw; format 5 with its checksum named; every row packed in a sidecar
    (no inline row, no file per row); `zg data inspect` and `zg data verify` read it; with the sidecar names
    unknown (another Lance version), the reader reads the same rows through Lance's take_blobs."""
    want = _raw(tiny_project)
    _materialize(tiny_project, codec="blob", writer_threads=2)
    assert_values_are(tiny_project, want)

    path = Layout(tiny_project).boundary("h02")
    ds = lance.dataset(str(path))
    meta = schema_meta(ds.schema)
    assert meta["format_version"] == 5 and meta["checksum"] == "xxh3_128" and meta["codec"]["layout"] == "blob"
    d = ds.to_table(columns=["hidden"]).column("hidden").combine_chunks()
    b = BoundaryDataset(path, recheck=True)
    assert set(d.field("kind").to_pylist()) == {blobs.PACKED} and set(d.field("size").to_pylist()) == {b.row_bytes}
    sidecars = [f for s in blobs.sidecar_dirs(ds, path) for f in s.iterdir()]
    assert sum(f.stat().st_size for f in sidecars) == len(b.seq_ids) * b.row_bytes  # the rows, back to back

    infos = {i["name"]: i for i in json.loads(zg_main("data", "inspect", "--json", cwd=tiny_project).stdout)}
    assert infos["h02"]["codec"] == "blob" and infos["h02"]["format_version"] == 5
    zg_main("data", "verify", "--lineage-only", cwd=tiny_project)  # every row's checksum, streamed from sidecars

    reader = lambda: blobs.blob_reader(lance.dataset(str(path)), path, b.seq_len * b.hidden, np.uint16)  # noqa: E731
    assert reader().__name__ == "read"  # the sidecars mapped
    rows = np.array([5, 0, 55, 17, 17])
    mapped = b.take(rows)
    monkeypatch.setattr(blobs, "_sidecar_name", lambda folder, blob_id: None)
    assert reader().__name__ == "through_lance"
    assert torch.equal(BoundaryDataset(path, recheck=True).take(rows).view(torch.int16), mapped.view(torch.int16))


def test_one_sidecar_per_data_file_and_several_read_the_same(tiny_project, monkeypatch):
    """zg asks Lance for one sidecar per data file (Lance's default starts one every GiB, so a reader of a 64-GiB
    boundary would hold 64 open maps); a dataset with several (Lance's default, or an older zg's) reads the same
    rows through the maps."""
    from zgdata.store import codec

    (field,) = codec.hidden_fields(8, 4, "bfloat16", "blob")
    assert field.metadata[b"lance-encoding:blob-pack-file-size-threshold"] == str(1 << 40).encode()
    want = _raw(tiny_project)
    path = Layout(tiny_project).boundary("h02")
    row_bytes = BoundaryDataset(path).row_bytes
    monkeypatch.setattr(codec, "BLOB_PACK_MAX", 3 * row_bytes)  # a new sidecar every 3 rows
    _materialize(tiny_project, codec="blob")
    ds = lance.dataset(str(path))
    assert min(len(list(s.iterdir())) for s in blobs.sidecar_dirs(ds, path)) > 1
    b = BoundaryDataset(path)
    assert blobs.blob_reader(ds, path, b.seq_len * b.hidden, np.uint16).__name__ == "read"  # mapped
    assert_values_are(tiny_project, want)


def test_thread_counts_and_write_behind_write_the_same_blob_bytes(tiny_project, tmp_path, monkeypatch):
    """One encoding thread without write-behind against three with a sync after every record batch (data files
    and sidecars synced while each group streams, and at its close): every data file and every sidecar hashes the
    same."""
    from zgdata.materialize.write_behind import WriteBehind

    other = shutil.copytree(tiny_project, tmp_path / "other", symlinks=True)
    _materialize(tiny_project, codec="blob", writer_threads=1, write_behind_mb=0, commit_rows=16)
    made, init, add, close = [], WriteBehind.__init__, WriteBehind.add, WriteBehind.close
    woken: list[bool] = []  # per add: whether it woke the sync thread

    def every_batch(self, dirs, every_bytes):
        init(self, dirs, 1 if every_bytes else 0)  # the tiny project's groups are far below 1 MB
        made.append(self)
        wake, self.wakes = self._wake.set, 0  # the thread waits on this very event: count its set() calls

        def counted_set():
            self.wakes += 1
            wake()

        self._wake.set = counted_set

    def counted_add(self, nbytes):
        before = self.wakes
        add(self, nbytes)
        woken.append(self._thread is not None and self.wakes > before)

    def sync_then_close(self):
        # Lance writes a tiny group's files as its streams end, and the group may close before the write-behind
        # thread has had a turn since (a CI run saw no sync at all): one sync here stands in for that turn, so the
        # check below covers the files each group wrote, whatever the scheduling (the thread's own syncs:
        # test_write_behind.py)
        self.sync()
        return close(self)

    monkeypatch.setattr(WriteBehind, "__init__", every_batch)
    monkeypatch.setattr(WriteBehind, "add", counted_add)
    monkeypatch.setattr(WriteBehind, "close", sync_then_close)
    _materialize(other, codec="blob", writer_threads=3, write_behind_mb=1, commit_rows=16)
    # every record batch was reported to a running write-behind thread, and each report woke it
    assert len(made) == 4 and len(woken) >= 4 * len(NAMES) and all(woken)
    # Lance writes each file under a temporary name and renames it: the folders each synced file was in
    folders = {Path(p).parent.name == "data" for w in made for p in w.synced}
    assert sum(w.syncs for w in made) > 0 and folders == {True, False}  # data files, sidecars
    one = _files(tiny_project)
    assert all(sidecar for n in NAMES for _, sidecar in one[n]) and one == _files(other)


@pytest.mark.long
def test_killed_blob_run_resumes_to_the_same_bytes(tiny_project, tmp_path):
    """kill -9 after a journaled commit: the resumed run deletes the unreferenced data files and sidecar folders
    and publishes what an uninterrupted run publishes."""
    want = shutil.copytree(tiny_project, tmp_path / "want", symlinks=True)
    _materialize(want, codec="blob", commit_rows=8, writer_threads=1)
    edit_params(tiny_project, materialize={"codec": "blob", "commit_rows": 8, "writer_threads": 2})
    shutil.rmtree(tiny_project / "data" / "boundaries")
    kill_after_first_commit_then_resume(tiny_project)
    assert _files(tiny_project) == _files(want)
    for n in NAMES:  # nothing left over: one sidecar folder per data file
        path = Layout(tiny_project).boundary(n)
        ds = lance.dataset(str(path))
        on_disk = sorted(p.name for p in (path / "data").iterdir())
        listed = sorted(d.path for f in ds.get_fragments() for d in f.data_files())
        assert on_disk == sorted([*listed, *(p.name for p in blobs.sidecar_dirs(ds, path))]), n


def test_sharded_blob_run_equals_one_process(tiny_project, ray_session):
    """Two Ray workers, each streaming its shard's sidecars: the published bits, fingerprint and stats are raw's,
    and the compacted sidecar holds every row's bytes in row order, as one process writes it."""
    want = _raw(tiny_project)
    r = _materialize(tiny_project, codec="blob", workers=2)
    got = assert_values_are(tiny_project, want)
    assert r.stats == {n: got[n][2] for n in NAMES}
    path = Layout(tiny_project).boundary("h02")
    (folder,) = blobs.sidecar_dirs(lance.dataset(str(path)), path)  # compacted into one data file
    (sidecar,) = folder.iterdir()
    assert sidecar.read_bytes() == want["h02"][0].numpy().tobytes()


def test_a_flipped_sidecar_byte_or_a_missing_sidecar_is_reported(tiny_project):
    """One changed byte in a sidecar: verify names the row and exits non-zero, and a read refuses the row. A data
    file's sidecar folder gone: opening the dataset says so and how to recover."""
    _materialize(tiny_project, codec="blob")
    path = Layout(tiny_project).boundary("h02")
    ds = lance.dataset(str(path))
    b = BoundaryDataset(path)
    sidecar = next(iter(blobs.sidecar_dirs(ds, path)[0].iterdir()))
    flip_and_check_row_3(tiny_project, path, sidecar, 3 * b.row_bytes + 11, "row 3 .*does not match its checksum")


def flip_and_check_row_3(root, path, sidecar, at: int, refused: str) -> None:
    """Flip a bit of byte ``at`` of ``sidecar`` (inside row 3 of boundary h02 at ``path``): verify names row 3 and
    exits non-zero, a read of rows 2-3 raises ``refused``; then with the sidecar's folder gone, opening the dataset
    says it is missing and how to recover."""
    ds = lance.dataset(str(path))
    raw = bytearray(sidecar.read_bytes())
    raw[at] ^= 0x40
    sidecar.unlink()  # a new inode: the DVC cache's hardlinked copy keeps its bytes
    sidecar.write_bytes(bytes(raw))

    res = zg_main("data", "verify", "--lineage-only", "--json", cwd=root, check=False)
    assert res.returncode != 0
    bad = [f for f in json.loads(res.stdout)["failures"] if f["check"] == "checksum"]
    assert [(p["boundary"], p["row"]) for p in bad] == [("h02", 3)]
    with pytest.raises(ZgError, match=refused):
        BoundaryDataset(path, version=ds.version).take([2, 3])

    shutil.rmtree(sidecar.parent)
    with pytest.raises(ZgError, match="missing") as e:
        BoundaryDataset(path, version=ds.version)
    assert "dvc" in e.value.fix

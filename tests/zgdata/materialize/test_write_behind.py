"""Write-behind (zgdata/materialize/write_behind.py): it syncs the files that appear after it starts, sidecar
folders included, once enough bytes were reported, skips files that vanish, hands any other sync error to the
group's close, and does nothing when off."""

from __future__ import annotations

import errno
import os

import pyarrow as pa
import pytest

from zgdata.materialize import write_behind
from zgdata.materialize.staging import Streams
from zgdata.materialize.write_behind import WriteBehind


def _wait(w: WriteBehind, syncs: int) -> None:
    import time

    for _ in range(500):
        if w.syncs >= syncs:
            return
        time.sleep(0.01)


def test_new_files_and_sidecars_are_synced_once_each_and_old_ones_never(tmp_path):
    d = tmp_path / "h02.lance" / "data"
    d.mkdir(parents=True)
    (d / "old.lance").write_bytes(b"earlier group")
    w = WriteBehind([d, tmp_path / "h04.lance" / "data"], every_bytes=100)  # h04: not created yet
    try:
        (d / "new.lance").write_bytes(b"x" * 10)
        (d / "new").mkdir()
        (d / "new" / "1.blob").write_bytes(b"y" * 10)
        w.add(99)
        assert w.syncs == 0  # below the threshold: the thread is not woken
        w.add(1)
        _wait(w, 2)
        assert sorted(os.path.basename(p) for p in w.synced) == ["1.blob", "new.lance"]
        w.sync()  # nothing grew: nothing synced again
        assert w.syncs == 2
        with open(d / "new.lance", "ab") as f:
            f.write(b"more")
        (d / "new" / "1.blob").unlink()  # an aborted group's orphan, removed meanwhile
        w.sync()
        assert w.syncs == 3 and w.synced[str(d / "new.lance")] == 14
    finally:
        w.close()
    assert w._thread is None


def test_off_starts_no_thread(tmp_path):
    w = WriteBehind([tmp_path], every_bytes=0)
    (tmp_path / "f").write_bytes(b"x")
    w.add(1 << 30)
    w.close()
    assert w._thread is None and w.syncs == 0


def test_a_failed_sync_fails_the_group_after_its_threads_are_joined(tmp_path, monkeypatch):
    """EIO from fdatasync (the disk did not take the bytes; simulated: a real one needs a failing disk) is not
    taken for a vanished file: the group's Streams.close raises it, after every writer and the write-behind
    thread have ended, and an aborted group's close does not."""

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(write_behind, "_datasync", eio)
    schema = pa.schema([pa.field("x", pa.int64())])
    for abort in (False, True):
        stage = tmp_path / f"stage-{abort}"
        streams = Streams(stage, ["h00", "h02"], schema, rows_per_file=100, write_behind=1)
        for n in ("h00", "h02"):
            streams.put(n, pa.record_batch([pa.array(range(10))], schema=schema))
        data = stage / "h00.lance" / "data"
        data.mkdir(parents=True, exist_ok=True)  # a data file Lance has started (it buffers 10 rows in memory)
        (data / "started.lance").write_bytes(b"x")
        streams.behind.sync()  # what the thread does every write_behind bytes, here at once
        if abort:
            streams.close(abort=True)
        else:
            with pytest.raises(OSError, match="Input/output error"):
                streams.close()
        assert streams.behind._thread is None and not any(t.is_alive() for t in streams.threads)


def test_a_dead_writer_fails_the_group_after_every_thread_is_joined(tmp_path):
    """One boundary's Lance writer fails (a batch of another schema): Streams.close raises its error, after the
    other writer and the write-behind thread have ended (Ray runs the next shard in the same process)."""
    schema = pa.schema([pa.field("x", pa.int64())])
    streams = Streams(tmp_path / "stage", ["h00", "h02"], schema, rows_per_file=100, write_behind=1)
    streams.put("h00", pa.record_batch([pa.array(["not an int"])], names=["x"]))
    streams.put("h02", pa.record_batch([pa.array(range(10))], schema=schema))
    with pytest.raises(Exception) as e:
        streams.close()
    assert e.value is streams.err["h00"] and "h02" not in streams.err
    assert streams.behind._thread is None and not any(t.is_alive() for t in streams.threads)

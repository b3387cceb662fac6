"""Write-behind (zgdata/materialize/write_behind.py): it syncs the files that appear after it starts, sidecar
folders included, once enough bytes were reported, skips files that vanish, and does nothing when off."""

from __future__ import annotations

import os

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

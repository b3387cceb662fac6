"""zgdata/core/atomic.py: a failed write leaves the old version and no scratch (the directory swap:
tests/zgdata/test_paths_guard.py)."""

from __future__ import annotations

import errno
import os

import pytest

from zgdata.core.atomic import atomic_path, write_text


def test_a_failure_inside_atomic_path_removes_the_scratch_and_keeps_the_old_file(tmp_path):
    """An exception in the body drops ``.NAME.partial`` and leaves ``NAME`` as it was."""
    p = tmp_path / "meta.json"
    p.write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(p) as tmp:
            tmp.write_text("new")
            assert tmp.exists()
            raise RuntimeError("boom")
    assert not tmp.exists() and not tmp.is_symlink()
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["meta.json"]


def test_a_durable_write_raises_a_disk_error_of_fsync_and_tolerates_only_einval(tmp_path, monkeypatch):
    """fsync's EIO is a lost write: it propagates and ``p`` keeps its old content; EINVAL (a file system that
    cannot sync) is not an error."""
    p = tmp_path / "metrics.json"
    p.write_text("old")

    def fsync_failing(code):
        def fsync(fd):
            raise OSError(code, os.strerror(code))

        return fsync

    monkeypatch.setattr(os, "fsync", fsync_failing(errno.EIO))
    with pytest.raises(OSError) as e:
        write_text(p, "new", durable=True)
    assert e.value.errno == errno.EIO
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["metrics.json"]

    monkeypatch.setattr(os, "fsync", fsync_failing(errno.EINVAL))
    write_text(p, "new", durable=True)
    assert p.read_text() == "new"

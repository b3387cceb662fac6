"""Write-behind: a commit group's files go to disk while the next batches encode, not all at the end.

Linux keeps written pages in memory until they are 30 s old or until dirty memory passes a share of RAM
(``vm.dirty_background_ratio``, 10% by default: 2.4 GB on the 24 GiB machines here, 100 GB on a 1 TiB GPU
box). A materialize run therefore leaves the disk idle while it encodes, and the disk then writes what piled
up all at once: at a sync, or when the kernel throttles every writer. ``WriteBehind`` syncs the new files of
the datasets a group writes every ``materialize.write_behind_mb`` of record batches, with ``os.fdatasync``
in a thread of its own, so the disk writes while the cores encode and Lance streams (the syscall releases
the GIL). Measured with the arms taking turns in one process (``python bench/write_behind.py``; files fsynced at
the end in every arm): syncs every 8, 16 or 32 MB took the blob write path from 0.98 to 1.15-1.24 of each
round's plain write, and raw's from 0.95 to 1.05-1.17 (docs/results/write-path.md, seventh pass).

It changes no byte and promises no durability: a run is safe against kills through the journal
(zgdata/materialize/staging.py), as before, not against power loss. A file that vanishes meanwhile (an
aborted group's orphans) is skipped; any other error of a sync (EIO, ENOSPC: the disk failed to write what the
group handed it) is kept and raised by ``close``, so the group fails instead of committing rows that may not be
on the disk.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["WriteBehind"]

_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class WriteBehind:
    """Sync the files that appear under ``dirs`` (one level of subfolders: blob sidecars) every ``every_bytes``
    reported by ``add``; 0 turns it off. Files present at construction (earlier groups) are left alone."""

    def __init__(self, dirs: list[Path], every_bytes: int):
        self.dirs, self.every, self.pending = [Path(d) for d in dirs], int(every_bytes), 0
        self.before = {d: set(os.listdir(d)) if d.is_dir() else set() for d in self.dirs}
        self.synced: dict[str, int] = {}  # path -> its size when it was last synced
        self.syncs = 0  # fdatasync calls made (tests read it)
        self.error: OSError | None = None  # the first sync that failed for another reason than a vanished file
        self._wake, self._stop = threading.Event(), False
        self._thread = None
        if self.every > 0:
            self._thread = threading.Thread(target=self._run, daemon=True, name="zg-write-behind")
            self._thread.start()

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` handed to the writers; past ``every_bytes`` the thread syncs what they wrote."""
        if self._thread is None:
            return
        self.pending += nbytes
        if self.pending >= self.every:
            self.pending = 0
            self._wake.set()

    def close(self) -> OSError | None:
        """Stop the thread (after the sync under way, if any); what is left is the kernel's to write. Returns the
        first sync error (not a vanished file), for the caller to raise; None if every sync went through."""
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        return self.error

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            self.sync()

    def sync(self) -> None:
        for d in self.dirs:
            for path in self._new_files(d):
                self._sync_file(path)

    def _new_files(self, d: Path):
        try:
            entries = list(os.scandir(d))
        except OSError:  # not created yet (a fresh dataset's first write)
            return
        for e in entries:
            if e.name in self.before[d]:
                continue
            try:
                if e.is_dir():
                    yield from (s.path for s in os.scandir(e.path) if s.is_file())
                else:
                    yield e.path
            except OSError:
                continue

    def _sync_file(self, path: str) -> None:
        try:
            size = os.stat(path).st_size
            if self.synced.get(path) == size:
                return
            fd = os.open(path, os.O_RDONLY)
            try:
                _datasync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:  # removed meanwhile: nothing to write
            return
        except OSError as e:  # the disk did not take the bytes: close() hands it on, later syncs still run
            if e.filename is None:
                e.filename = path  # fdatasync names no file: the user's message does (zgdata/errors.py)
            self.error = self.error or e
            return
        self.synced[path] = size
        self.syncs += 1

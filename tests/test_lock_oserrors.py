"""Project locks and OS errors.

Two `zg` runs writing the same outputs: while a `zg` process holds the lock, a second run (in the test's
own process, through the CLI's ``main``) fails at once with one line naming the first one's pid, and the
first one's outputs come out exactly right. The first process is held inside its run with SIGSTOP (it
holds its lock while stopped), so nothing here depends on timing.
A full disk (a small tmpfs) and a read-only bind mount give one-line errors, publish nothing and
leave a state that a rerun completes. Mounting needs root (CI runs as root); elsewhere those
tests skip and say so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.helpers.assertions import assert_user_error
from tests.helpers.datasets import journal_rows
from tests.helpers.projects import edit_params, read_json, tree_sha256
from tests.helpers.runners import BIN, run, zg_main
from zgdata.core.lock import BUSY_EXIT_CODE, lock_path, stage_lock
from zgdata.errors import from_os_error
from zgdata.layout import Layout

# ---------------------------------------------------------------- helpers


def _start(root: Path, *args, env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen(
            [str(BIN / "zg"), *args], cwd=root, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=err, text=True
        )


def _wait_for(proc: subprocess.Popen, cond, log: Path, what: str) -> None:
    deadline = time.monotonic() + 600  # a hang guard, not a timing assertion
    while not cond():
        assert proc.poll() is None, f"zg exited ({proc.returncode}) before {what}: {log.read_text()}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.02)


def _holder_pid(root: Path, name: str) -> int | None:
    """The pid recorded in a lock file (cleared when the lock is released), or None."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads(lock_path(Layout(root), name).read_text())["pid"]
    return None


@contextlib.contextmanager
def _stopped(proc: subprocess.Popen, root: Path, lock: str):
    """``proc`` frozen by SIGSTOP while it provably holds ``lock``; resumed (or killed) on exit."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert proc.poll() is None and _holder_pid(root, lock) == proc.pid, "the first run no longer holds its lock"
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def _finish(proc: subprocess.Popen, log: Path) -> str:
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"the first run failed ({proc.returncode}): {log.read_text()}"
    return out


def _expected_rows(root: Path) -> int:
    return sum(read_json(root / "data" / "tokens.json")["rows"].values())


def _assert_boundaries_exact(root: Path, reference: Path) -> None:
    """Every boundary holds each row exactly once (seq_id 0..n-1) and the same bits as an undisturbed run."""
    n = _expected_rows(root)
    names = sorted(p.name for p in (reference / "data" / "boundaries").glob("*.lance"))
    assert names and sorted(p.name for p in (root / "data" / "boundaries").glob("*.lance")) == names
    for name in names:
        got = lance.dataset(str(root / "data" / "boundaries" / name)).to_table()
        want = lance.dataset(str(reference / "data" / "boundaries" / name)).to_table()
        seq = got.column("seq_id").to_numpy()
        assert got.num_rows == n and len(np.unique(seq)) == n, (name, got.num_rows, n)
        assert np.array_equal(seq, np.arange(n)), name
        assert got.column("hidden").equals(want.column("hidden")), name


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode:
        pytest.skip(
            f"`mount {' '.join(args)}` is not permitted here ({res.stderr.strip()[:120]}); "
            "these tests need root, as on CI"
        )


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)  # still busy: detach lazily


@contextlib.contextmanager
def _read_only(path: Path):
    """``path`` made read-only by binding it onto itself, then remounting that bind read-only."""
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _umount(path)


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 512, 1):  # unbuffered, so the last partial block fills too
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    assert shutil.disk_usage(directory).free == 0
    return filler


# ---------------------------------------------------------------- locks


@pytest.mark.long
def test_second_materialize_is_refused_and_the_first_publishes_exact_rows(tiny_built, tiny_project):
    root = tiny_project
    shutil.rmtree(root / "data" / "boundaries")
    log = root.parent / "first.stderr"
    first = _start(root, "data", "materialize", env={"ZG_FAILPOINT_SLEEP_AFTER_COMMIT": "0.5"}, log=log)
    try:
        _wait_for(first, lambda: journal_rows(root) > 0, log, "a journaled commit")
        with _stopped(first, root, "materialize"):
            staged = tree_sha256(root / "data" / ".staging")
            second = zg_main("data", "materialize", cwd=root, check=False)
            assert second.returncode == BUSY_EXIT_CODE
            assert_user_error(
                second,
                f"another zg process (pid {first.pid}: `zg data materialize`)",
                "is writing data/boundaries",
                "wait for it",
                "kill -9",
                alone=True,
            )
            assert tree_sha256(root / "data" / ".staging") == staged, "the refused run touched the staging"
            assert not (root / "data" / "boundaries").exists()
    finally:
        _finish(first, log)
    _assert_boundaries_exact(root, tiny_built)
    assert not any((root / "data" / ".staging").iterdir())
    assert _holder_pid(root, "materialize") is None  # released
    # the lock files stay out of git (zg init's .gitignore) and out of DVC's view
    assert "/.zg/" in (root / ".gitignore").read_text().split() and "/.zg/" in (root / ".dvcignore").read_text()
    assert ".zg" not in run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root).stdout


@pytest.mark.long
def test_same_block_twice_is_refused_while_another_block_trains(tiny_project):
    root = tiny_project
    blocks = root / "models" / "blocks"
    log = root.parent / "b00.stderr"
    first = _start(root, "train", "block", "b00", "--json", env={"ZG_FAILPOINT_SLEEP_AFTER_STEP": "0.2"}, log=log)
    try:
        _wait_for(
            first,
            lambda: (blocks / "b00" / "meta.json").exists() and _holder_pid(root, "block-b00"),
            log,
            "the first checkpoint",
        )
        with _stopped(first, root, "block-b00"):
            before = tree_sha256(blocks / "b00")
            second = zg_main("train", "block", "b00", cwd=root, check=False)
            assert second.returncode == BUSY_EXIT_CODE
            assert_user_error(second, f"pid {first.pid}: `zg train block b00 --json`", "is writing models/blocks/b00")
            assert tree_sha256(blocks / "b00") == before, "the refused run touched models/blocks/b00"
            # one lock per block key: b01 trains to the end while b00's lock is held
            other = json.loads(zg_main("train", "block", "b01", "--json", cwd=root).stdout)
            assert other["status"] == "done" and other["step"] == other["steps"]
    finally:
        out = _finish(first, log)
    r = json.loads(out)
    assert r["status"] == "done" and r["step"] == r["steps"] == 12
    assert read_json(root / "metrics" / "blocks" / "b00.json")["state_sha256"] == r["state_sha256"]
    curve = (root / "plots" / "loss" / "b00.csv").read_text().splitlines()
    assert curve[0] == "step,loss" and [int(x.split(",")[0]) for x in curve[1:]] == list(range(12))
    assert {p.name for p in (blocks / "b00").iterdir()} == {
        "init.safetensors",
        "meta.json",
        "model.safetensors",
        "ckpt-000012",
    }


def test_block_lock_removes_what_a_killed_checkpoint_write_left(tmp_path, capfd):
    """A run killed inside a checkpoint write leaves atomic_path's scratch names (.ckpt-N.partial/,
    .model.safetensors.partial) in the DVC output dir."""
    layout = Layout(tmp_path)
    d = layout.block_dir("b00")
    (d / ".ckpt-000008.partial").mkdir(parents=True)
    (d / ".ckpt-000008.partial" / "model.safetensors").write_bytes(b"half")
    (d / ".model.safetensors.partial").write_bytes(b"half")
    (d / "ckpt-000004").mkdir()
    (d / "meta.json").write_text("{}")
    keep = tree_sha256(d / "ckpt-000004")
    with stage_lock(layout, "block", "b00"):
        assert sorted(p.name for p in d.iterdir()) == ["ckpt-000004", "meta.json"]
    assert tree_sha256(d / "ckpt-000004") == keep
    err = capfd.readouterr().err
    assert "train b00: removed what a killed run left half-written" in err and ".ckpt-000008.partial" in err


# ---------------------------------------------------------------- OS errors


@pytest.mark.long
def test_full_disk_during_materialize_is_one_line_and_a_rerun_resumes(tiny_built, tiny_project):
    root = tiny_project
    data = root / "data"
    keep = root / "data.orig"
    data.rename(keep)
    data.mkdir()
    _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(data))
    try:
        for name in ("tokens.lance", "tokens.json"):
            (shutil.copytree if (keep / name).is_dir() else shutil.copy2)(keep / name, data / name)
        log = root.parent / "full.stderr"
        first = _start(root, "data", "materialize", env={"ZG_FAILPOINT_SLEEP_AFTER_COMMIT": "0.5"}, log=log)
        try:
            _wait_for(first, lambda: journal_rows(root) > 0, log, "a journaled commit")
            with _stopped(first, root, "materialize"):
                done = journal_rows(root)
                filler = _fill(data)  # the next commit finds the disk full
            first.communicate(timeout=600)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        res = subprocess.CompletedProcess(first.args, first.returncode, "", log.read_text())
        line = assert_user_error(res, "No space left on device (ENOSPC) at data/.staging", "free space", alone=True)
        assert not (data / "boundaries").exists() or not any((data / "boundaries").iterdir()), line
        assert 0 < done < _expected_rows(root)

        filler.unlink()
        dead = data / ".staging" / "0123456789abcdef"  # staging of an earlier run with other inputs
        dead.mkdir()
        (dead / "journal.json").write_text('{"rows_done": 8, "versions": {}, "stats": {}}')
        again = zg_main("data", "materialize", "--json", cwd=root)
        assert json.loads(again.stdout)["resumed_from"] == done
        assert "removed 1 staging dir(s) of earlier runs" in again.stderr and "0123456789abcdef" in again.stderr
        assert not dead.exists()
        _assert_boundaries_exact(root, tiny_built)
    finally:
        _umount(data)
        data.rmdir()
        keep.rename(data)


def test_a_disk_error_of_a_write_behind_sync_is_one_line_and_a_rerun_finishes(tiny_built, tiny_project, monkeypatch):
    """EIO from a write-behind fdatasync (simulated: a real one needs a failing disk) fails materialize with one line
    naming the file, publishes nothing, and a rerun once the disk is fine writes the same bits."""
    from zgdata.materialize import write_behind

    root = tiny_project
    shutil.rmtree(root / "data" / "boundaries")
    edit_params(root, materialize={"write_behind_mb": 1})  # syncs within the tiny project's few MB
    synced = []

    def eio(fd):
        synced.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(write_behind, "_datasync", eio)
    close = write_behind.WriteBehind.close

    def sync_then_close(self):
        # the thread's sync, made once the group's writers have put their files on disk: the tiny run's rows end
        # before the thread wakes, and a sync right after a batch is handed over can find its file not yet written
        # (a race that failed this test once under load)
        self.sync()
        return close(self)

    monkeypatch.setattr(write_behind.WriteBehind, "close", sync_then_close)
    res = zg_main("data", "materialize", cwd=root, check=False)
    assert synced, "no write-behind sync ran: the test did not reach what it tests"
    line = assert_user_error(res, "Input/output error (EIO) at data/.staging/", "check it", alone=True)
    assert ".lance" in line, line
    assert not (root / "data" / "boundaries").exists() or not any((root / "data" / "boundaries").iterdir()), line
    monkeypatch.undo()
    zg_main("data", "materialize", cwd=root)
    _assert_boundaries_exact(root, tiny_built)


def test_read_only_output_dir_is_one_line_and_changes_nothing(tiny_project):
    data = tiny_project / "data"
    before = tree_sha256(data)
    with _read_only(data):
        res = zg_main("data", "tokenize", cwd=tiny_project, check=False)
    # the first write tokenize attempts is its spill folder beside data/tokens.lance
    assert_user_error(
        res, "Read-only file system (EROFS) at data/.tokens.lance.spill", "choose a writable directory", alone=True
    )
    assert tree_sha256(data) == before


def test_os_errors_of_the_libraries_become_zg_errors(tmp_path):
    """The real exceptions Lance, safetensors and Python raise on a full and on a read-only disk: the libraries zg
    writes with (checkpoints and weights are safetensors; nothing zg writes goes through torch.save)."""
    from safetensors.torch import save_file

    full, ro = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    table = pa.table({"x": np.arange(200_000, dtype=np.float64)})
    writers = {
        "lance": lambda d: lance.write_dataset(table, str(d / "x.lance")),
        "safetensors": lambda d: save_file({"a": torch.zeros(200_000)}, str(d / "x.safetensors")),
        "python": lambda d: (d / "x.txt").write_bytes(b"\0" * 2_000_000),
    }
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full))
    try:
        with _read_only(ro):
            for where, words in ((full, "No space left on device (ENOSPC)"), (ro, "Read-only file system (EROFS)")):
                for name, write in writers.items():
                    with pytest.raises(Exception) as info:
                        write(where)
                    err = from_os_error(info.value, where / "stage-out")
                    assert err is not None, (name, where, repr(info.value))
                    msg = err.render()
                    assert msg.startswith(words) and str(where) in msg and "\n" not in msg, (name, msg)
                    if name == "python" and where == ro:
                        assert str(where / "x.txt") in msg  # Python names the file itself
    finally:
        _umount(full)
    # anything else stays a bug with its traceback
    assert from_os_error(ValueError("bad value")) is None
    assert from_os_error(FileNotFoundError(errno.ENOENT, "No such file or directory", "x")) is None
    # raised from an OS error: the cause decides
    try:
        try:
            raise PermissionError(errno.EACCES, "Permission denied", "/srv/x")
        except OSError as e:
            raise RuntimeError("could not write") from e
    except RuntimeError as e:
        assert from_os_error(e).render().startswith("Permission denied (EACCES) at /srv/x")


def test_lock_nests_in_one_thread_and_refuses_another_thread(tmp_path):
    import threading

    from zgdata.errors import ZgError

    layout = Layout(tmp_path)
    refused = []

    def other():
        try:
            with stage_lock(layout, "tokens"):
                refused.append(False)
        except ZgError as e:
            refused.append(str(e))

    with stage_lock(layout, "tokens"):
        with stage_lock(layout, "tokens"):  # a stage calling another under the same lock
            assert _holder_pid(tmp_path, "tokens") == os.getpid()
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert refused and refused[0] and f"pid {os.getpid()}" in refused[0] and "is writing" in refused[0]
    assert _holder_pid(tmp_path, "tokens") is None
    with stage_lock(layout, "tokens"):  # free again once released
        pass


def test_a_refused_block_lock_leaves_the_holders_partial_checkpoint_alone(tmp_path):
    """The block's cleanup of ``.*.partial`` runs only once the lock is taken: a refused second run must not delete
    the checkpoint the holder is writing right now."""
    import threading

    from zgdata.errors import ZgError

    layout = Layout(tmp_path)
    d = layout.block_dir("b00")
    refused = []

    def other():
        try:
            with stage_lock(layout, "block", "b00"):
                refused.append(False)
        except ZgError as e:
            refused.append(str(e))

    with stage_lock(layout, "block", "b00"):
        partial = d / ".ckpt-000008.partial"
        partial.mkdir(parents=True)
        (partial / "model.safetensors").write_bytes(b"being written")
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert refused and refused[0] and "is writing" in refused[0]
        assert sorted(x.name for x in d.iterdir()) == [".ckpt-000008.partial"]
        assert (partial / "model.safetensors").read_bytes() == b"being written"

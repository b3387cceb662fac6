"""One engine at a time: while `zg repro` trains blocks, it holds DVC's own write locks on their outputs.

`dvc repro` takes a write lock on each stage's outputs (DVC's rwlock, ``.dvc/tmp/rwlock``) before it deletes and
rebuilds them, and refuses a stage whose outputs another live process has locked ("'models/blocks/b01' is busy,
it is being blocked by: (PID ...): zg repro"). So `zg repro` locks the outputs of every block it is about to train
through the same mechanism, in the driver process: a `dvc repro` started meanwhile stops at that stage before it
deletes anything. A block's locks are released just before `zg repro` records it with `dvc commit`, which takes the
same locks itself. DVC drops the entries of a process that died, so a killed driver blocks nothing.
"""

from __future__ import annotations

from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["OutputLocks"]


class OutputLocks:
    """DVC write locks on groups of output paths, held by this process, released one group at a time."""

    def __init__(self, root: Path, cmd: str = "zg repro"):
        self.root, self.cmd, self._held = Path(root), cmd, {}

    def hold(self, name: str, paths: list[Path]) -> None:
        """Lock PATHS (absolute or relative to the project) as group NAME; a one-line error when DVC holds them."""
        from dvc.fs import localfs
        from dvc.lock import LockError
        from dvc.rwlock import rwlock

        tmp = self.root / ".dvc" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        cm = rwlock(str(tmp), localfs, self.cmd, [], [str(self.root / p) for p in paths], False)
        try:
            cm.__enter__()
        except LockError as e:
            raise ZgError(
                f"{name}'s outputs are locked by another DVC process: {str(e).splitlines()[0]}",
                fix="wait for that `dvc repro` (or `dvc commit`) to finish, then rerun `zg repro`",
            ) from e
        self._held[name] = cm

    def release(self, name: str) -> None:
        cm = self._held.pop(name, None)
        if cm is not None:
            cm.__exit__(None, None, None)

    def close(self) -> None:
        for name in list(self._held):
            self.release(name)

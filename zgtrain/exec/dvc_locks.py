"""One engine at a time: while `zg repro` trains blocks, it holds DVC's own write locks on their outputs.

`dvc repro` takes a write lock on each stage's outputs (DVC's rwlock, ``.dvc/tmp/rwlock``) before it deletes and
rebuilds them, and refuses a stage whose outputs another live process has locked ("'models/blocks/b01' is busy,
it is being blocked by: (PID ...): zg repro"). So `zg repro` locks the outputs of every block it is about to train
through the same mechanism, in the driver process: a `dvc repro` started meanwhile stops at that stage before it
deletes anything. A block's locks are released just before `zg repro` records it with `dvc commit`, which takes the
same locks itself. DVC drops the entries of a process that died, so a killed driver blocks nothing.

It also holds read locks on what those blocks depend on (boundaries, teacher slices, params.yaml, code), as `dvc
repro` does for the stage it runs: a `dvc repro materialize` (or `dvc checkout`) started meanwhile stops before it
rewrites a boundary a block is training on, which `dvc commit` would otherwise record as that block's input.
"""

from __future__ import annotations

from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["OutputLocks", "local_deps"]


class OutputLocks:
    """DVC locks on groups of paths (outputs to write, inputs to read), held by this process, released one group
    at a time."""

    def __init__(self, root: Path, cmd: str = "zg repro"):
        self.root, self.cmd, self._held = Path(root), cmd, {}

    def hold(self, name: str, paths: list[Path], read: list[Path] = ()) -> None:
        """Lock PATHS for writing and READ for reading (absolute or relative to the project) as group NAME; a
        one-line error when another DVC process holds them."""
        from dvc.exceptions import DvcException
        from dvc.fs import localfs
        from dvc.lock import LockError
        from dvc.rwlock import rwlock

        tmp = self.root / ".dvc" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        absolute = lambda ps: [str(self.root / p) for p in ps]  # noqa: E731
        cm = rwlock(str(tmp), localfs, self.cmd, absolute(read), absolute(paths), False)
        try:
            cm.__enter__()
        except LockError as e:
            what = name if read and not paths else f"{name}'s outputs"
            raise ZgError(
                f"{what} are locked by another DVC process: {str(e).splitlines()[0]}",
                fix="wait for that `dvc repro` (or `dvc commit`) to finish, then rerun `zg repro`",
            ) from e
        except DvcException as e:  # DVC rewrites the file in place: a process killed mid-write leaves it torn
            raise ZgError(
                f"DVC's lock file cannot be read ({e})",
                fix=f"make sure no `dvc` or `zg repro` runs in {self.root}, then remove {tmp / 'rwlock'}",
            ) from e
        self._held[name] = cm

    def release(self, name: str) -> None:
        cm = self._held.pop(name, None)
        if cm is not None:
            cm.__exit__(None, None, None)

    def close(self) -> None:
        for name in list(self._held):
            self.release(name)


def local_deps(stage) -> list[str]:
    """The paths a DVC stage depends on, as `dvc repro` read-locks them while it runs the stage (DVC's
    ``rwlocked``: every dependency but another repository's)."""
    from dvc.dependency.db import AbstractDependency
    from dvc.dependency.repo import RepoDependency

    return [d.fs_path for d in stage.deps if not isinstance(d, (RepoDependency, AbstractDependency))]

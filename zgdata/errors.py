"""One error type for everything a user can fix, and the mapping of OS failures onto it.

The CLI prints ``ZgError`` as a single line (what was wrong, which key, what to do)
and exits non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shlex

__all__ = ["ZgError", "from_os_error", "from_nondeterministic", "dvc_checkout", "dvc_pull", "shell_arg"]


class ZgError(Exception):
    """A user-facing error: ``what`` went wrong and ``fix`` says what to do next."""

    def __init__(self, what: str, *, fix: str = "", key: str | None = None, code: int = 2):
        self.what = what
        self.fix = fix
        self.key = key
        self.code = code
        super().__init__(self.render())

    def render(self) -> str:
        parts = [f"[{self.key}] {self.what}" if self.key else self.what]
        if self.fix:
            parts.append(self.fix)
        return " ".join(p.rstrip(".") + "." for p in parts)


def shell_arg(path) -> str:
    """``path`` as one shell word, so advice that names it runs as written when pasted into a shell (a corpus file
    a user added with `dvc add` may have a space in its name). A plain path is unchanged."""
    return shlex.quote(str(path))


def dvc_checkout(*paths) -> str:
    """The command that restores DVC-tracked ``paths`` from the cache. ``--force``: DVC leaves a
    changed output in place without it (exit 255, "Can't remove the following unsaved files without
    confirmation"; checked with DVC 3.67), and a changed file is what most refusals find."""
    return "dvc checkout --force " + " ".join(shell_arg(p) for p in paths)


def dvc_pull(*paths) -> str:
    """The command that fetches DVC-tracked ``paths`` from the project's remote and checks them out."""
    return "dvc pull " + " ".join(shell_arg(p) for p in paths)


# The OS conditions a user fixes outside zg: errno -> (what happened, what to do).
# The message starts with the OS's own words (os.strerror), so it can be searched for.
_FIXES = {
    errno.ENOSPC: "free space on that disk (or move the project to a bigger one), then rerun",
    errno.EDQUOT: "free space or raise your quota on that disk, then rerun",
    errno.EACCES: "fix the permissions (owner/mode) of that path, or work in a directory you can write",
    errno.EPERM: "fix the permissions (owner/mode) of that path, or work in a directory you can write",
    errno.EROFS: "choose a writable directory for the project (or remount that file system read-write)",
    errno.EIO: "the disk failed a read or write: check it (dmesg, SMART) or move the project to another disk, then rerun",
}
# Libraries written in Rust or C++ (Lance, safetensors, torch, Arrow) raise RuntimeError/ValueError/
# OSError without errno; their text carries the C library's strerror, often with "(os error N)".
_STRERROR = {os.strerror(n): n for n in _FIXES}
_OS_ERROR_N = re.compile(r"\((?:os error|errno) (\d+)\)|\[errno (\d+)\]", re.IGNORECASE)
_QUOTED_PATH = re.compile(r"""(?:path|file|directory)\s*['"]([^'"]+)['"]""", re.IGNORECASE)


def _errno_of(e: BaseException) -> int | None:
    n = getattr(e, "errno", None)
    if isinstance(n, int) and n in _FIXES:
        return n
    if not isinstance(e, (OSError, RuntimeError, ValueError)) and type(e).__name__ != "SafetensorError":
        return None
    text = str(e)
    for m in _OS_ERROR_N.finditer(text):
        n = int(m.group(1) or m.group(2))
        if n in _FIXES:
            return n
    for s, n in _STRERROR.items():  # exact strerror text, e.g. "No space left on device"
        if s in text:
            return n
    return None


def _show(path) -> str:
    p = os.fspath(path)
    rel = os.path.relpath(p) if os.path.isabs(p) else p
    return rel if not rel.startswith("..") else p


def from_os_error(e: BaseException, path: str | os.PathLike | None = None) -> ZgError | None:
    """A one-line ``ZgError`` for a full disk, a quota, missing permission, a read-only file system or a disk I/O error
    (from ``e`` or the exception it was raised from), or None when ``e`` is something else.

    ``path``: where the failing stage writes, named when the error does not carry its own path
    (Lance reports "No space left on device" without one).
    """
    seen, cause = 0, e
    while cause is not None and seen < 5:
        n = _errno_of(cause)
        if n is not None:
            where = getattr(cause, "filename", None)  # exact when Python raised it
            if where is None and path is None:  # the stage's own path beats a library's temp name
                m = _QUOTED_PATH.search(str(cause))
                where = m.group(1) if m else None
            where = path if where is None else where
            at = f" at {_show(where)}" if where is not None else " (the library did not say which path)"
            return ZgError(f"{os.strerror(n)} ({errno.errorcode[n]}){at}", fix=_FIXES[n])
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


# torch's refusal of an op without a deterministic kernel, under torch.use_deterministic_algorithms(True)
_NONDETERMINISTIC = re.compile(r"^(\S+) does not have a deterministic implementation")


def from_nondeterministic(e: BaseException) -> ZgError | None:
    """A one-line ``ZgError`` for torch's refusal of an op that has no deterministic kernel (zg runs CUDA in torch's
    strict deterministic mode: zgdata/core/runtime.py), or None when ``e`` is something else."""
    m = _NONDETERMINISTIC.match(str(e)) if isinstance(e, RuntimeError) else None
    if m is None:
        return None
    return ZgError(
        f"torch has no deterministic kernel for {m.group(1)} on this device, and zg runs CUDA in torch's strict "
        "deterministic mode (the bitwise guarantees need it)",
        fix="run this stage on the CPU (unset ZG_DEVICE), or rerun it with `zg --debug` and report the op with its "
        "traceback",
    )

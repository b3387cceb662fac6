"""The per-user key that authenticates the trust cache, kept outside every project.

``.zg/trust.json`` maps a file's stat (inode, size, modification and change time) to the md5 zg computed, so a
repeat check need not read the file again. Whoever can write the project could also write that cache: an entry
holding a poisoned file's stat and the md5 dvc.lock records would turn the check off. So each entry carries an
HMAC-SHA256 of (path, stat, md5) under a random key that lives in the user's state folder
(``$XDG_STATE_HOME/zg/trust.key``, default ``~/.local/state/zg/trust.key``, mode 0600), never in the project, a
clone or a DVC remote. An entry without a valid seal is ignored and the file is hashed again. Where no key can be
kept (no writable home), nothing is cached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

__all__ = ["key_path", "key", "seal"]

_KEY: dict[Path, bytes | None] = {}  # per key path, for this process


def key_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "zg" / "trust.key"


def key() -> bytes | None:
    """This user's key (made on first use), or None where it cannot be read or made."""
    path = key_path()
    if path not in _KEY:
        _KEY[path] = _read_or_make(path)
    return _KEY[path]


def _read_or_make(path: Path) -> bytes | None:
    try:
        raw = path.read_bytes()
        if len(raw) == 32:
            return raw
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = secrets.token_bytes(32)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(new)
        try:
            os.link(tmp, path)  # first writer wins: a concurrent process keeps the key already there
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        raw = path.read_bytes()
        return raw if len(raw) == 32 else None
    except OSError:
        return None


def seal(k: bytes, path: str, stat: list, md5: str) -> str:
    """The entry's HMAC-SHA256 (hex) under key K."""
    return hmac.new(k, json.dumps([path, *stat, md5]).encode(), hashlib.sha256).hexdigest()

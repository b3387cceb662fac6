"""No path leaves the project: an output zg writes, or a path read from metadata, must resolve inside its root.

A symlink (``models/blocks/b01 -> /elsewhere``) or a ``..`` in a recorded name (meta.json's ``checkpoint``) would
otherwise let a cloned repository, or an edited metadata file, make zg write or read outside the project. ``inside``
resolves both (every symlink followed, ``..`` collapsed) and refuses with one line when the path escapes.
"""

from __future__ import annotations

from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["inside"]


def inside(path: Path | str, root: Path | str, *, what: str, fix: str = "") -> Path:
    """``path`` unchanged when it resolves inside ``root`` (both resolved); else a ZgError naming ``what``."""
    path = Path(path)
    real, base = path.resolve(), Path(root).resolve()
    if real != base and base not in real.parents:
        raise ZgError(
            f"{what} {path} resolves to {real}, outside {base}",
            fix=fix
            or f"remove the symlink or the '..' in {path} (zg never reads or writes outside the project), then rerun",
        )
    return path

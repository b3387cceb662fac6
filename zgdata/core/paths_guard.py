"""No path leaves the project: an output zg writes, or a path read from metadata, must resolve inside its root.

A symlink (``metrics -> /elsewhere``, ``models/blocks/b01 -> /elsewhere``) or a ``..`` in a recorded name
(meta.json's ``checkpoint``) would otherwise let a cloned repository, or an edited metadata file, make zg
write or read outside the project. Each check resolves the path (every symlink followed, ``..`` collapsed)
and refuses with one line when it escapes. Three entry points:

- ``inside(path, root)``: a path read from metadata, or a folder zg writes into (every symlink followed).
- ``output(path)``: a file or folder zg publishes by replacing it (zgdata/core/atomic.py calls it for every write);
  its project root is found from the path itself (``project_root``). The path's last component is replaced,
  never written through, so a link there to a *file* is allowed (DVC's symlink cache type links each
  workspace file into its cache, which may live anywhere); a link to a folder, and a link in any parent, is
  resolved and checked.
- ``project_root(path)``: the nearest ancestor of the path as written (absolute, symlinks not followed)
  holding params.yaml, dvc.yaml or .dvc/.

Inputs the user names in params.yaml (a corpus, a teacher source) are not checked: they may live anywhere.
Each check costs a resolve and a few stats per output, never per row.
"""

from __future__ import annotations

from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["inside", "output", "project_root"]

MARKERS = ("params.yaml", "dvc.yaml", ".dvc")


def _refuse(path: Path, real: Path, base: Path, what: str, fix: str) -> ZgError:
    return ZgError(
        f"{what} {path} resolves to {real}, outside {base}",
        fix=fix
        or f"remove the symlink or the '..' in {path} (zg never reads or writes outside the project), then rerun",
    )


def _within(real: Path, base: Path) -> bool:
    return real == base or base in real.parents


def inside(path: Path | str, root: Path | str | None = None, *, what: str, fix: str = "") -> Path:
    """``path`` unchanged when it resolves inside ``root`` (both resolved; default: its ``project_root``, none:
    unchecked); else a ZgError naming ``what``."""
    path = Path(path)
    root = project_root(path) if root is None else root
    if root is None:
        return path
    real, base = path.resolve(), Path(root).resolve()
    if not _within(real, base):
        raise _refuse(path, real, base, what, fix)
    return path


def project_root(path: Path | str) -> Path | None:
    """The nearest ancestor of ``path`` (made absolute, not resolved) that holds params.yaml, dvc.yaml or .dvc/;
    None outside any project."""
    for d in Path(path).absolute().parents:
        if any((d / m).exists() for m in MARKERS):
            return d
    return None


def output(path: Path | str, root: Path | str | None = None, *, what: str = "output", fix: str = "") -> Path:
    """``path`` unchanged when what a replacing write of it touches stays inside ``root`` (default: its
    ``project_root``; none: unchecked); else a ZgError. A link to a file as the last component is allowed
    (it is replaced, not followed); everything else is resolved."""
    path = Path(path)
    base = project_root(path) if root is None else Path(root)
    if base is None:
        return path
    base = base.resolve()
    if path.is_symlink() and not path.is_dir():  # a file link (or a dangling one): replaced, never written through
        real = path.parent.resolve() / path.name
    else:
        real = path.resolve()
    if not _within(real, base):
        raise _refuse(path, real, base, what, fix)
    return path

"""What ``dvc add`` recorded in git: the md5 of a file or folder that a ``.dvc`` file beside it tracks (a corpus, an
eval set, a teacher folder), for ``zgdata/trust/dvc_lock.py``.

The record that counts is the ``.dvc`` file as git's HEAD has it, not the workspace copy: ``dvc repro`` re-records
a changed ``dvc add`` output by itself before the stages that depend on it run ("Verifying data sources in stage"),
so after a pull of swapped bytes the workspace copy says whatever the remote served. A ``.dvc`` file git does not
have yet (added, not committed), or a project outside git, has only its workspace copy, which is used.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["Record", "holding", "outputs"]


@dataclass(frozen=True)
class Record:
    out: Path  # the tracked file or folder (absolute)
    md5: str  # "....dir" for a folder
    by: str  # for messages: "corpus.dvc (git HEAD)"
    fix: str


def _text(dvcfile: Path) -> tuple[str, bool]:
    """The ``.dvc`` file's text and whether it came from git's HEAD."""
    try:
        res = subprocess.run(
            ["git", "show", f"HEAD:./{dvcfile.name}"], cwd=dvcfile.parent, capture_output=True, check=False
        )
        if res.returncode == 0:
            return res.stdout.decode("utf-8"), True
    except (OSError, UnicodeDecodeError):
        pass
    try:
        return dvcfile.read_text(), False
    except (OSError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{dvcfile} cannot be read ({e})", fix=f"restore it from git (`git checkout {dvcfile.name}`)"
        ) from e


def outputs(dvcfile: Path, root: Path) -> list[Record]:
    """The outputs ``dvcfile`` records. Only DVC 3 entries (``hash: md5``: the md5 of the bytes; DVC 2 hashed
    text with its line endings changed, which zg does not redo)."""
    import yaml

    from zgdata.yamlio import safe_load

    text, in_git = _text(dvcfile)
    name = os.path.relpath(dvcfile, root)
    try:
        doc = safe_load(text)
    except yaml.YAMLError as e:
        raise ZgError(
            f"{name} is not a readable .dvc file ({str(e).splitlines()[0]})",
            fix=f"restore it from git (`git checkout {name}`)",
        ) from e
    outs = doc.get("outs") if isinstance(doc, dict) else None
    by = f"{name} (git HEAD)" if in_git else name
    records = []
    for o in outs or []:
        if isinstance(o, dict) and o.get("path") and o.get("md5") and o.get("hash") == "md5":
            out = Path(os.path.normpath(dvcfile.parent / o["path"]))
            rel = os.path.relpath(out, root)
            fix = (
                f"restore what git records: `git checkout {name} && dvc checkout {rel}` (or `dvc pull {rel}` from a "
                f"remote you trust); if you changed it on purpose, record it: `dvc add {rel} && git commit {name}`"
            )
            records.append(Record(out, str(o["md5"]), by, fix))
    return records


def holding(root: Path, p: Path, read: dict[Path, list[Record]]) -> Record | None:
    """The record of the ``.dvc`` output that is ``p`` or a folder holding it, below ``root``. `dvc add X` writes
    ``X.dvc`` beside X, so the candidates are ``p.dvc`` and each parent folder's. ``read``: the ``.dvc`` files
    read so far by this caller (one ``git show`` each, however many files of a folder it is asked about)."""
    for out in [p, *p.parents]:
        if root not in out.parents:
            return None
        dvcfile = out.with_name(out.name + ".dvc")
        if dvcfile.is_file():
            if dvcfile not in read:
                read[dvcfile] = outputs(dvcfile, root)
            for r in read[dvcfile]:
                if r.out == out:
                    return r
    return None

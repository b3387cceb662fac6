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

from zgdata.errors import ZgError, dvc_checkout, dvc_pull, shell_arg

__all__ = ["Record", "holding", "outputs", "parse", "entry", "read_text"]


@dataclass(frozen=True)
class Record:
    out: Path  # the tracked file or folder (absolute)
    md5: str  # "....dir" for a folder
    by: str  # for messages: "corpus.dvc (git HEAD)"
    fix: str


def read_text(path: Path, name: str) -> str:
    """A DVC file's text (``name``: as messages call it, relative to its project); unreadable: one line."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{name} cannot be read ({e})", fix=f"restore it from git (`git checkout {shell_arg(name)}`)"
        ) from e


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
    return read_text(dvcfile, dvcfile.name), False


def parse(text: str, name: str, lists: tuple[str, ...] = ("outs", "deps")) -> dict:
    """A DVC file's document (a ``.dvc`` file, dvc.lock): a mapping whose ``lists`` keys, where present, hold lists of
    mappings, as DVC writes them. Anything else (not YAML, another shape) is one line naming ``name``: a record that
    cannot be read is refused, never skipped, so a damaged one cannot switch a check off."""
    import yaml

    from zgdata.yamlio import safe_load

    try:
        doc = safe_load(text)
    except yaml.YAMLError as e:
        raise ZgError(
            f"{name} is not a readable DVC file ({str(e).splitlines()[0]})",
            fix=f"restore it from git (`git checkout {shell_arg(name)}`)",
        ) from e
    return entry(doc, name, name, lists)


def entry(doc, what: str, file: str, lists: tuple[str, ...] = ("outs", "deps")) -> dict:
    """``doc`` (``what``: a DVC file, or a stage of dvc.lock, in ``file``) as a mapping whose ``lists`` keys hold
    lists of mappings; None is an empty mapping; any other shape is one line."""
    fix = f"restore it from git (`git checkout {shell_arg(file)}`)"
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ZgError(f"{what} is not what DVC writes (a YAML {type(doc).__name__}, not a mapping)", fix=fix)
    for key in lists:
        entries = doc.get(key)
        if entries is not None and not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
            raise ZgError(f"{what} is not what DVC writes: its {key} is not a list of entries", fix=fix)
    return doc


def outputs(dvcfile: Path, root: Path) -> list[Record]:
    """The outputs ``dvcfile`` records. Only DVC 3 entries (``hash: md5``: the md5 of the bytes; DVC 2 hashed
    text with its line endings changed, which zg does not redo)."""
    text, in_git = _text(dvcfile)
    name = os.path.relpath(dvcfile, root)
    doc = parse(text, name)
    deps = doc.get("deps") or []
    imported = any(isinstance(d.get("repo"), dict) for d in deps)
    by = f"{name} (git HEAD)" if in_git else name
    records = []
    for o in doc.get("outs") or []:
        if o.get("path") and o.get("md5") and o.get("hash") == "md5":
            out = Path(os.path.normpath(dvcfile.parent / o["path"]))
            rel = os.path.relpath(out, root)
            restore = (
                f"restore what git records: `git checkout {shell_arg(name)} && {dvc_checkout(rel)}` "
                f"(or `{dvc_pull(rel)}`"
            )
            fix = restore + (
                # `dvc add` over an import would record these bytes as the source repository's at its commit
                ", which fetches it from its source again); never `dvc add` an imported output"
                if imported
                else f" from a remote you trust); if you changed it on purpose, record it: "
                f"`dvc add {shell_arg(rel)} && git commit {shell_arg(name)}`"
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

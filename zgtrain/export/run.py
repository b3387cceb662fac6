"""`zg export`: a student folder zg wrote, as a deployable model with its lineage (export.json).

``export(student, fmt, out, dtype)`` resolves the student (a folder, or one of the project's: student,
repaired, search), asks the format's writer whether it can express it (zgtrain/export/hf.py ``check_hf``,
zgtrain/export/gguf.py ``check_gguf``; a refusal is one line and nothing is written), then writes the output
atomically under the ``export`` lock: a stock transformers folder (hf) or ``<out>/<name>.gguf`` (gguf), with
``export.json`` (format, dtype, the source folder's sha256, the teacher's and the tokenizer's identity, every
output file's sha256, zg's version) and a model card that records the export (zgtrain/student/card.py
``export_card``), beside it. The default output is ``models/export/<name>-<dtype>/`` in the project.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from zgdata.core.hashing import file_sha256
from zgdata.errors import ZgError, shell_arg
from zgdata.layout import Layout
from zgdata.trust import dvc_lock as trust
from zgtrain.export.target import RECORD, check_target, record_path
from zgtrain.project.sections import DEFAULT_DTYPE

__all__ = ["FORMATS", "DTYPES", "DEFAULT_DTYPE", "NAMES", "ExportResult", "resolve_student", "default_out", "export"]

FORMATS = ("hf", "gguf")
DTYPES = {"hf": ("f32", "f16", "bf16"), "gguf": ("f32", "f16", "bf16", "q8_0")}
NAMES = ("student", "repaired", "search")
"""The project's student folders by name: models/student, models/repaired, models/search/student."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What `zg export` wrote (``--json`` prints it)."""

    path: str
    """The output folder."""
    format: str
    dtype: str
    student: str
    """The source student folder."""
    student_sha256: str
    files: dict
    """{file in the output folder: sha256} (export.json and the card excluded)."""
    record: str
    """export.json's path."""
    info: dict
    """What the format's writer reports (hf: the stock class and config; gguf: its own)."""

    def metrics(self) -> dict:
        return asdict(self)


def resolve_student(student: str | Path, layout: Layout = Layout()) -> Path:
    """A student folder from a name (student, repaired, search) or a path; a one-line error where it is none."""
    named = layout.students.get(str(student))
    path = named if named is not None else Path(student)
    if not path.is_dir():
        fix = {
            "student": "run `dvc repro assemble` (or `zg train assemble`)",
            "repaired": "set repair.steps > 0, run `zg pipeline`, then `dvc repro repair`",
            "search": "run `dvc repro search_assemble`",
        }.get(str(student), "name a student folder, or one of student, repaired, search")
        raise ZgError(f"no student folder at {path}", fix=fix)
    return path


def _name(student: str | Path, path: Path, layout: Layout) -> str:
    if str(student) in NAMES:
        return str(student)
    for name, p in layout.students.items():
        if p.resolve() == path.resolve():
            return name
    return path.resolve().name


def default_out(student: str | Path, dtype: str, layout: Layout = Layout()) -> Path:
    """``models/export/<name>-<dtype>`` in the project (name: student, repaired, search, or the folder's)."""
    path = resolve_student(student, layout)
    return layout.export_dir(_name(student, path, layout), dtype)


def _shown(path: Path, layout: Layout) -> str:
    """``path`` relative to the project root where it is inside (export.json is the same on every machine)."""
    try:
        return path.resolve().relative_to(layout.root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _check_choice(fmt: str, dtype: str | None) -> str:
    if fmt not in FORMATS:
        raise ZgError(f"--format {fmt} is not an export format", fix=f"use one of {', '.join(FORMATS)}")
    dtype = dtype or DEFAULT_DTYPE[fmt]
    every = sorted({d for ds in DTYPES.values() for d in ds})
    if dtype not in every:
        raise ZgError(f"--dtype {dtype} is not an export dtype", fix=f"use one of {', '.join(every)}")
    if dtype not in DTYPES[fmt]:
        raise ZgError(
            f"--dtype {dtype} is not a {fmt} weights type ({fmt}: {', '.join(DTYPES[fmt])})",
            fix="use --format gguf for q8_0" if dtype == "q8_0" else f"use one of {', '.join(DTYPES[fmt])}",
        )
    return dtype


def _refusal(check, src: Path, dtype: str, student: str | Path) -> None:
    """The writer's ``check`` of ``src``; its advice to run `zg export --format hf` names ``student``: the writers
    check a folder and do not know which argument named it, and without one `zg export` takes models/student."""
    try:
        check(src, dtype=dtype)
    except ZgError as e:
        if str(student) == "student" or _HF not in e.fix:
            raise
        named = f"`zg export {shell_arg(student)} --format hf`"
        raise ZgError(e.what, fix=e.fix.replace(_HF, named), key=e.key, code=e.code) from None


_HF = "`zg export --format hf`"


def _backend(fmt: str):
    """(check, write) of a format; the writers import torch, transformers or gguf only when called."""
    if fmt == "hf":
        from zgtrain.export.hf import check_hf, export_hf

        return check_hf, export_hf
    try:
        from zgtrain.export.gguf import check_gguf, export_gguf
    except ImportError as e:
        raise ZgError(f"the GGUF writer is unavailable in this zg ({e})", fix="use --format hf") from e
    return check_gguf, export_gguf


def _lineage(path: Path, layout: Layout) -> dict:
    """The teacher's and the tokenizer's identity: the student's zerograph.json, the project's teacher.json (where it
    is this student's teacher), and the sha256 of the tokenizer files the student carries."""
    summary = json.loads((path / "zerograph.json").read_text())
    out = {"family": summary.get("family", "llama"), "teacher_sha256": summary.get("teacher_sha256")}
    out["tokenizer_files"] = {n: file_sha256(path / n) for n in _TOKENIZER_FILES if (path / n).is_file()}
    try:
        teacher = json.loads(layout.teacher_json.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        teacher = {}
    mine = teacher.get("weights_sha256") == out["teacher_sha256"]
    out["teacher_source"] = teacher.get("source") if mine else None
    out["tokenizer_sha256"] = teacher.get("tokenizer_sha256") if mine else None
    return out


def _record(fmt, dtype, name, src, sha, lineage, files, info, layout) -> dict:
    """export.json: what was exported, from which student (its sha256), with which teacher and tokenizer."""
    return {
        "format": fmt,
        "dtype": dtype,
        "name": name,
        "student": _shown(src, layout),
        "student_sha256": sha,
        **lineage,
        "files": files,
        "info": info,
        "zg_version": _version(),
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zerograph")
    except PackageNotFoundError:
        return "unknown"


def export(
    student: str | Path = "student",
    fmt: str = "hf",
    out: Path | None = None,
    dtype: str | None = None,
    *,
    layout: Layout = Layout(),
) -> ExportResult:
    """Export ``student`` (a folder, or student / repaired / search) as ``fmt`` in ``dtype`` to ``out`` (default
    ``models/export/<name>-<dtype>``): check first (nothing written on refusal), then write atomically."""
    from zgdata.core.atomic import atomic_path, write_json, write_text
    from zgdata.core.lock import lock_path, project_lock
    from zgtrain.student.card import export_card
    from zgtrain.student.load import student_sha256

    dtype = _check_choice(fmt, dtype)
    src = resolve_student(student, layout)
    trust.verify(src)  # against git's dvc.lock, where it records the folder, before anything is written
    name = _name(student, src, layout)
    out = Path(out).expanduser() if out is not None else default_out(student, dtype, layout)
    a, b = src.resolve(), out.resolve()
    if a == b or a in b.parents:
        raise ZgError(f"--out {out} overlaps the student folder {src}", fix="export to a folder of its own")
    check_target(out, layout.root)  # a folder that holds the student is refused here: it is none of zg's exports
    single = fmt == "gguf" and out.suffix == ".gguf"  # --out x.gguf: the file itself, its record beside it
    if single and out.is_dir():
        raise ZgError(f"--out {out} is a folder (a previous export of zg)", fix="name a .gguf file or that folder")
    check, write = _backend(fmt)
    _refusal(check, src, dtype, student)  # a refusal here has written nothing
    root = layout.root.resolve()
    inside = b == root or root in b.parents
    # the lock guards the output's folder where it is the project's; a path outside it is the user's to name
    guard = {"writes": out, "errors_at": out.parent} if inside else {"writes": lock_path(layout, "export")}
    with project_lock(layout, "export", **guard):
        sha = student_sha256(src)
        lineage = _lineage(src, layout)
        if single:
            with atomic_path(out) as tmp:
                info = write(src, tmp, dtype=dtype)
            files = {out.name: file_sha256(out)}
            # after the file: a kill between the two leaves a file no record claims, which is never replaced
            write_json(record_path(out), _record(fmt, dtype, name, src, sha, lineage, files, info, layout))
        else:
            with atomic_path(out) as tmp:
                tmp.mkdir()
                info = write(src, tmp if fmt == "hf" else tmp / f"{name}.gguf", dtype=dtype)
                files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
                record = _record(fmt, dtype, name, src, sha, lineage, files, info, layout)
                write_json(tmp / RECORD, record)
                write_text(tmp / "README.md", export_card(record))
    return ExportResult(
        path=str(out),
        format=fmt,
        dtype=dtype,
        student=_shown(src, layout),
        student_sha256=sha,
        files=files,
        record=str(record_path(out)),
        info=info,
    )

"""The assembled student on disk: its shipped modeling code, pinned by hash, and the one way to load it.

A student whose blocks differ in MLP width needs modeling code (transformers has no per-layer
width). zg ships that code itself (zgtrain/student/templates/): modeling_zg_gpt2.py in GPT-2 students, the generic
modeling_zg_dense.py in every other family's (classes ``Zg<config class>`` and ``Zg<causal LM class>``, made from
the family's stock ones; Llama and Qwen2 had files of their own before). Their attention code is generated from
zgtrain/block/ (zgtrain/student/template_source.py). Assemble records the family and the file's sha256 in ``zerograph.json``, and
a student loads with ``trust_remote_code`` only when the folder holds exactly one zg modeling file for its family,
named by exactly zg's ``auto_map`` for that file, whose sha256 is the pinned one and is this zg's template or a
released one (zgtrain/student/released.py: a student assembled by an earlier zg keeps running the file it was
assembled with, from its own folder). Anything else a pulled student folder might carry is refused, never imported.

checksums.json, written last by assemble and repair, records the sha256 of every weights file
(``*.safetensors``); ``load_student`` refuses a folder whose weights differ from it. A folder written
before checksums.json existed is refused (re-record it: `dvc repro -f assemble`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

from zgdata.core.hashing import file_sha256
from zgdata.errors import ZgError
from zgdata.families.registry import family
from zgdata.families.registry import known as known_family
from zgdata.trust import dvc_lock as trust
from zgdata.trust.safetensors_check import check_header
from zgtrain.fit.rerun import model_of
from zgtrain.student.released import released_name

__all__ = [
    "MODELING_FILE",
    "AUTO_MAP",
    "modeling_file",
    "auto_map",
    "template_class",
    "template_sha256",
    "accepted_files",
    "ship_modeling_code",
    "load_student",
    "student_sha256",
    "CHECKSUMS",
    "record_checksums",
    "check_checksums",
]

CHECKSUMS = "checksums.json"

_TEMPLATES = Path(__file__).parent / "templates"


def _fix(folder: Path) -> str:
    """Rebuild the model in ``folder`` with its own stage (assemble, repair, search_assemble ...)."""
    return f"rebuild it with `dvc repro -f {model_of(folder).stage}` (zg never runs modeling code it did not write)"


def modeling_file(model_type: str) -> str:
    """The modeling file this zg ships for a family (its ``template``, zgdata/families/): GPT-2 its own, every other
    family the dense one (its classes are made on first access from the family's stock classes, so adding a family
    never changes the pinned file)."""
    fam = family(model_type)
    return f"modeling_zg_{fam.template or model_type}.py"


def accepted_files(model_type: str) -> list[str]:
    """The modeling file names a student of this family may hold: this zg's, and the family's own file that an
    earlier zg shipped (modeling_zg_llama.py, modeling_zg_qwen2.py); which bytes run is RELEASED's to say."""
    return sorted({modeling_file(model_type), f"modeling_zg_{model_type}.py"})


def auto_map(model_type: str, file: str | None = None) -> dict:
    """The auto_map of a family's student whose modeling file is ``file`` (default: this zg's)."""
    fam, stem = family(model_type), (file or modeling_file(model_type)).removesuffix(".py")
    return {"AutoConfig": f"{stem}.Zg{fam.config_class}", "AutoModelForCausalLM": f"{stem}.Zg{fam.model_class}"}


MODELING_FILE = modeling_file("llama")  # students assembled before families carry no family: they are Llama
AUTO_MAP = auto_map("llama")


def template_class(model_type: str, which: str):
    """zg's own per-layer-width class (``which``: AutoConfig or AutoModelForCausalLM) of a family."""
    module, name = auto_map(model_type)[which].split(".")
    return getattr(importlib.import_module(f"zgtrain.student.templates.{module}"), name)


def template_sha256(model_type: str = "llama") -> str:
    return file_sha256(_TEMPLATES / modeling_file(model_type))


def ship_modeling_code(folder: Path, model_type: str = "llama") -> str:
    """Copy zg's modeling file of a family into a saved student folder and point config.json's auto_map at it."""
    folder = Path(folder)
    name = modeling_file(model_type)
    (folder / name).write_bytes((_TEMPLATES / name).read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = auto_map(model_type)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return template_sha256(model_type)


def _remote_code_allowed(folder: Path) -> bool:
    """True when the folder needs zg's own modeling file and holds exactly one, this zg's or a released one (the
    pinned sha256, listed in RELEASED under the file's name; the file runs from the folder); False when it needs
    none."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "zerograph.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{folder} is not a student zg assembled (config.json / zerograph.json unreadable: {e})", fix=_fix(folder)
        ) from e
    model_type = summary.get("family", "llama")
    if not isinstance(model_type, str) or not known_family(model_type):
        raise ZgError(
            f"{folder / 'zerograph.json'} names a model family zg does not know ({str(model_type)[:40]})",
            fix=_fix(folder),
        )
    found = cfg.get("auto_map")
    named = next((n for n in accepted_files(model_type) if found == auto_map(model_type, n)), None)
    allowed = {named} if named else set(accepted_files(model_type))  # zg's auto_map: only the file it names
    extra_code = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.name not in allowed)
    if extra_code:
        raise ZgError(f"{folder} holds Python files zg did not write ({', '.join(extra_code)})", fix=_fix(folder))
    if not found:
        return False
    if named is None:
        raise ZgError(
            f"{folder / 'config.json'} has an auto_map zg did not write ({json.dumps(found)[:120]})", fix=_fix(folder)
        )
    code = folder / named
    pinned, ours = summary.get("modeling_sha256"), template_sha256(model_type)
    got = file_sha256(code) if code.exists() else None
    known = (got == ours and named == modeling_file(model_type)) or released_name(got) == named
    if got is None or got != pinned or not known:
        raise ZgError(
            f"{code} is not the modeling file zg wrote (sha256 {str(got)[:12]}, pinned {str(pinned)[:12]}; "
            f"this zg's is {ours[:12]}, and no released one has that name and sha256)",
            fix=_fix(folder),
        )
    return True


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix == ".safetensors")


def record_checksums(folder: Path) -> None:
    """Write checksums.json: the sha256 of each weights file in ``folder``."""
    sums = {p.name: file_sha256(p) for p in _weight_files(folder)}
    (Path(folder) / CHECKSUMS).write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n")


def check_checksums(folder: Path) -> None:
    """Refuse a folder whose weights files are not those checksums.json records, and one without checksums.json
    (fail closed: a folder of an older zg is re-recorded by assembling it again)."""
    path = Path(folder) / CHECKSUMS
    if not path.exists():
        raise ZgError(
            f"{path} is missing: nothing records which weights files {Path(folder)} should hold",
            fix=f"re-record it by building it again: `dvc repro -f {model_of(folder).stage}`",
        )
    try:
        want = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is not valid JSON ({e})", fix=_fix(folder)) from e
    got = {p.name: file_sha256(p) for p in _weight_files(folder)}
    bad = sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
    if bad:
        raise ZgError(
            f"{Path(folder) / bad[0]} is not the weights file zg wrote (sha256 "
            f"{str(got.get(bad[0]))[:12]}, {CHECKSUMS} records {str(want.get(bad[0]))[:12]})",
            fix=model_of(folder).restore(),
        )


def _check_weight_files(folder: Path) -> None:
    """Refuse a folder without safetensors weights, or with a pickled weights file beside them (zg never
    unpickles: transformers falls back to a pytorch_model.bin when no model.safetensors is there, and the
    checksums cover safetensors files only), and a weights file whose header is not safetensors', before
    transformers opens anything."""
    files = _weight_files(folder)
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    if not files or pickled:
        raise ZgError(
            f"{folder} holds "
            + (
                f"pickled weights ({', '.join(pickled)}), which zg never loads"
                if pickled
                else "no .safetensors weights"
            ),
            fix="remove them, or convert them to safetensors; or rebuild it with "
            f"`dvc repro -f {model_of(folder).stage}`",
        )
    for p in files:
        check_header(p, fix=model_of(folder).restore())


def load_student(folder: Path, *, dtype=None, lineage: bool = True):
    """The student as a transformers model in eval mode, with sdpa attention (the family's: Gemma 2 eager).
    ``lineage``: check the folder against git's dvc.lock first (False only for a folder the running stage wrote)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ZgError(f"{folder} not found", fix=f"run `dvc repro {model_of(folder).stage}`")
    if lineage:  # an input: against git's dvc.lock, where it records the folder; the digests beside it come next
        trust.verify(folder)
    remote = _remote_code_allowed(folder)
    _check_weight_files(folder)
    check_checksums(folder)
    fam = family(json.loads((folder / "zerograph.json").read_text()).get("family", "llama"))  # read above
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype or torch.float32, trust_remote_code=remote, use_safetensors=True, **fam.load_kwargs()
    ).eval()


def student_sha256(folder: Path) -> str:
    """sha256 over every file (relative name + bytes) of a student folder: what a repair run started from. The
    model card (README.md, zgtrain/student/card.py) is documentation, not the model: it is left out, so a card
    changes no run's identity. checksums.json is derived from the weights files hashed here: it is left out too."""
    h = hashlib.sha256()
    for p in sorted(x for x in Path(folder).rglob("*") if x.is_file() and x.name not in ("README.md", CHECKSUMS)):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()

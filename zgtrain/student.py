"""The assembled student on disk: its shipped modeling code, pinned by hash, and the one way to load it.

A student whose blocks differ in MLP width needs modeling code (transformers has no per-layer
width for Llama). zg ships that code itself (zgtrain/templates/modeling_zg_llama.py), records
its sha256 in ``zerograph.json`` at assemble, and loads a student with ``trust_remote_code``
only when the folder holds exactly that file, with that hash, named by exactly zg's
``auto_map``. Anything else a pulled student folder might carry is refused, never imported.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["MODELING_FILE", "AUTO_MAP", "template_sha256", "ship_modeling_code", "load_student"]

MODELING_FILE = "modeling_zg_llama.py"
AUTO_MAP = {"AutoConfig": "modeling_zg_llama.ZgLlamaConfig",
            "AutoModelForCausalLM": "modeling_zg_llama.ZgLlamaForCausalLM"}
_TEMPLATE = Path(__file__).parent / "templates" / MODELING_FILE
_FIX = "rebuild the student with `dvc repro -f assemble` (zg never runs modeling code it did not write)"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def template_sha256() -> str:
    return _sha256(_TEMPLATE)


def ship_modeling_code(folder: Path) -> str:
    """Copy zg's modeling file into a saved student folder and point config.json's auto_map at it."""
    folder = Path(folder)
    (folder / MODELING_FILE).write_bytes(_TEMPLATE.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = dict(AUTO_MAP)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return template_sha256()


def _remote_code_allowed(folder: Path) -> bool:
    """True when the folder needs zg's own modeling file and holds exactly it; False when it needs none."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "zerograph.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{folder} is not a student zg assembled (config.json / zerograph.json unreadable: {e})",
                      fix=_FIX) from e
    auto_map = cfg.get("auto_map")
    extra_code = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.name != MODELING_FILE)
    if extra_code:
        raise ZgError(f"{folder} holds Python files zg did not write ({', '.join(extra_code)})", fix=_FIX)
    if not auto_map:
        return False
    if auto_map != AUTO_MAP:
        raise ZgError(f"{folder / 'config.json'} has an auto_map zg did not write ({json.dumps(auto_map)[:120]})",
                      fix=_FIX)
    code = folder / MODELING_FILE
    pinned = summary.get("modeling_sha256")
    got = _sha256(code) if code.exists() else None
    if got is None or got != pinned or got != template_sha256():
        raise ZgError(f"{code} is not the modeling file zg wrote (sha256 {str(got)[:12]}, pinned "
                      f"{str(pinned)[:12]}, this zg's {template_sha256()[:12]})", fix=_FIX)
    return True


def load_student(folder: Path, *, dtype=None):
    """The student as a transformers model in eval mode, with sdpa attention."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ZgError(f"{folder} not found", fix="run `dvc repro assemble`")
    remote = _remote_code_allowed(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32, trust_remote_code=remote,
                                                attn_implementation="sdpa").eval()

"""Every modeling file zg has shipped inside a student folder, by sha256: the files a student may run.

A student's modeling file is pinned (``modeling_sha256`` in its zerograph.json) and lives in its own folder, so a
student assembled by an earlier zg keeps running the file it was assembled with. ``load_student``
(zgtrain/student/load.py) runs a folder's file only when its sha256 is the pinned one and is listed here under the
file's own name (the name is the first word of the entry); any other file is refused, never imported.

A template change (``python -m zgtrain.student.template_source`` after an edit in zgtrain/block/, or an edit of a
template's own code) adds the new file's sha256 here; an entry is never removed, or the students holding that file
stop loading. tests/zgtrain/student/test_released.py checks that every template this zg ships is listed, and loads
students assembled by the released files (tests/fixtures/students/), comparing their logits bit for bit.
"""

from __future__ import annotations

__all__ = ["RELEASED", "released_name"]

RELEASED = {
    # the four templates at 766fb76, the last commit before the one template source (hand-edited copies)
    "aef59c544fe17d2eb93e2f5d0af42de38d0ee82798121e187406a0f3c44311de": "modeling_zg_llama.py as of 766fb76",
    "78fa140dbedf1fda0d4dcdc07f377e0daaa6281b25592b805598462f84c12410": "modeling_zg_qwen2.py as of 766fb76",
    "424e3401e66f0f952119154ca36b8ff15741c93e7b23c9456ab9d4d16b99fd77": "modeling_zg_dense.py as of 766fb76",
    "53e1a4cbb66557ff5fe0e328d3a67a7e98bd0f0c323d233ee53029f05fbbf254": "modeling_zg_gpt2.py as of 766fb76",
    # generated from zgtrain/block/ (zgtrain/student/template_source.py); Llama and Qwen2 students ship the dense file
    "9df08419fd886669c0ae584f86e58249a39ad986a3039bf1b0b36581c737ba0f": "modeling_zg_dense.py, first generated",
    "2c2b4edda066eea7d52a367c10e636dda6c81a1a6919879b7c764fc9f1b90483": "modeling_zg_gpt2.py, first generated",
    # per-layer expert counts of mixture-of-experts students (mlp_fields, layer_experts, layer_top_k)
    "8de29331d1230ccf109097e1b010ac4c5ddd997e1e98d3088b7ab9a7abb4ce18": "modeling_zg_dense.py with per-layer experts",
}


def released_name(sha256: str | None) -> str | None:
    """The file name a released modeling file of this sha256 was shipped as (None: not a released file)."""
    entry = RELEASED.get(sha256 or "")
    return entry.split()[0].rstrip(",") if entry else None

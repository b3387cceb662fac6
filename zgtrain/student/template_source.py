"""The shipped modeling templates' copies of zg's attention code, generated: ``python -m zgtrain.student.template_source``.

A student folder's modeling file may import only torch and transformers, so each template zg ships
(zgtrain/student/templates/modeling_zg_dense.py and modeling_zg_gpt2.py) carries the classes its layers run:
``SlidingWindow`` (zgtrain/block/window.py) and the attention replacements with their cache layers
``AttentionLinearState``, ``AttentionLinear``, ``LinearAttentionState``, ``LinearAttention``
(zgtrain/block/attention.py). They are never edited in a template. Each sits in a generated region::

    # >>> generated from zgtrain/block/window.py: SlidingWindow (...)
    class SlidingWindow: ...
    # <<< generated

which this module rewrites with the exact source text (``inspect.getsource``) of the named classes of that file;
the rest of a template (docstring, imports, the ``Zg`` classes) is written by hand in the template itself.
tests/zgtrain/student/test_template_source.py fails while a committed template differs from what this makes, so a
change to those classes reaches the templates in the same commit, and student blocks and assembled students run
the same code (their logits are compared bit for bit).

Regenerating changes a template's bytes, so its sha256: add the new sha256 to RELEASED (zgtrain/student/released.py;
a test checks every shipped template is listed) and keep the old entries, so students assembled before still load.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from zgtrain.block import attention, window

__all__ = ["TEMPLATES", "GENERATED", "COMMAND", "region", "render", "stale", "main"]

TEMPLATES = Path(__file__).parent / "templates"
GENERATED = ("modeling_zg_dense.py", "modeling_zg_gpt2.py")
"""The templates this zg ships (Llama and Qwen2 students ship the dense one)."""
COMMAND = "python -m zgtrain.student.template_source"

_MODULES = {"zgtrain/block/window.py": window, "zgtrain/block/attention.py": attention}
_REGION = re.compile(
    r"^# >>> generated from (?P<path>\S+): (?P<names>\w+(?:, \w+)*)(?: \([^\n]*\))?\n(?P<body>.*?)^# <<< generated\n",
    re.M | re.S,
)


def region(path: str, names: list[str]) -> str:
    """One generated region: its marker lines around the source of ``names`` in ``path`` (a zgtrain/block file)."""
    if path not in _MODULES:
        raise ValueError(f"{path} is not a source the templates copy from ({', '.join(_MODULES)})")
    module = _MODULES[path]
    body = "\n\n".join(inspect.getsource(getattr(module, n)) for n in names)
    return f"# >>> generated from {path}: {', '.join(names)} (edit it there)\n{body}# <<< generated\n"


def render(text: str) -> str:
    """A template's text with each generated region rewritten from the current source."""
    if not _REGION.search(text):
        raise ValueError("no generated region (# >>> generated from ...) in this template")
    return _REGION.sub(lambda m: region(m["path"], m["names"].split(", ")), text)


def stale() -> list[str]:
    """The shipped templates whose committed text is not what ``render`` makes now."""
    return [n for n in GENERATED if (TEMPLATES / n).read_text() != render((TEMPLATES / n).read_text())]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the shipped templates' generated regions (``--check``: only list the stale ones; exit 1 if any)."""
    args = sys.argv[1:] if argv is None else argv
    check = args == ["--check"]
    if args and not check:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    out = stale()
    for name in out:
        path = TEMPLATES / name
        if not check:
            path.write_text(render(path.read_text()))
        print(f"{path} {'is stale' if check else 'regenerated'}", file=sys.stderr)
    return 1 if check and out else 0


if __name__ == "__main__":
    sys.exit(main())

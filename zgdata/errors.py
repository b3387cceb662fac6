"""One error type for everything a user can fix.

The CLI prints ``ZgError`` as a single line (what was wrong, which key, what to do)
and exits non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["ZgError"]


class ZgError(Exception):
    """A user-facing error: ``what`` went wrong and ``fix`` says what to do next."""

    def __init__(self, what: str, *, fix: str = "", key: str | None = None, code: int = 2):
        self.what = what
        self.fix = fix
        self.key = key
        self.code = code
        super().__init__(self.render())

    def render(self) -> str:
        parts = [f"[{self.key}] {self.what}" if self.key else self.what]
        if self.fix:
            parts.append(self.fix)
        return " ".join(p.rstrip(".") + "." for p in parts)

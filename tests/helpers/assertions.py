"""What a failed `zg` run must look like: one ``error:`` line, no traceback."""

from __future__ import annotations

import functools

__all__ = ["assert_user_error", "assert_user_error_alone"]


def assert_user_error(res, *needles: str, alone: bool = False) -> str:
    """A failed `zg` run that printed one ``error:`` line (no traceback) containing every needle.

    ``alone``: that line is all of stderr (commands that fail before any progress output)."""
    assert res.returncode != 0, f"expected a failure:\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() if alone or line.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"expected one error line, got:\n{res.stderr}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


# The data commands fail before any progress output: their error line must be all of stderr.
assert_user_error_alone = functools.partial(assert_user_error, alone=True)

"""Generation check: greedy continuations of fixed held-out prompts by teacher and student, side by side.

The prompts are the first ``eval.prompt_tokens`` tokens of ``eval.generate_prompts`` held-out
rows spread evenly over the split (the same rows every run). Decoding is plain greedy
argmax with no sampling, penalty or stopping rule (every continuation has exactly
``eval.generate_tokens`` tokens), in this module rather than through ``generate()``, so a
model's own generation_config cannot change what is compared. The report,
reports/generation.md, is written by evaluate; metrics/eval.json carries how many leading
tokens of each continuation the student shares with the teacher.
"""

from __future__ import annotations

import html

import numpy as np
import torch

from zgdata.errors import ZgError

__all__ = ["prompts", "greedy", "matching_prefix", "report"]


def prompts(ids: torch.Tensor, n: int, prompt_tokens: int) -> tuple[list[int], torch.Tensor]:
    """(row indices, (n, prompt_tokens) prompt ids): ``n`` rows spread evenly over the set."""
    if prompt_tokens >= ids.shape[1]:
        raise ZgError(
            f"eval.prompt_tokens {prompt_tokens} is not below the sequence length {ids.shape[1]}",
            key="eval.prompt_tokens",
            fix=f"use a value below {ids.shape[1]}",
        )
    rows = sorted(set(np.linspace(0, len(ids) - 1, num=min(n, len(ids))).round().astype(int).tolist()))
    return rows, ids[rows, :prompt_tokens]


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """(n, new_tokens) argmax continuations (full forward each step: short prompts, no cache to differ)."""
    x = prompt.to(model.device)
    for _ in range(new_tokens):
        nxt = model(input_ids=x).logits[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], dim=1)
    return x[:, prompt.shape[1] :].cpu()


def matching_prefix(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Per row: how many leading tokens of ``a`` and ``b`` agree."""
    same = (a == b).int()
    return [int(r.cumprod(0).sum()) for r in same]


def _cell(text: str) -> str:
    """Text for one markdown table cell: HTML-escaped, pipes escaped, line breaks as <br>."""
    return html.escape(text).replace("|", "&#124;").replace("\r", "").replace("\n", "<br>") or " "


def report(
    tok,
    rows: list[int],
    prompt: torch.Tensor,
    teacher: torch.Tensor,
    student: torch.Tensor,
    set_name: str,
    repaired: torch.Tensor | None = None,
) -> str:
    """Markdown: per prompt, the teacher's, the student's and (with repair on) the repaired student's greedy
    continuations side by side, with how many leading tokens each shares with the teacher."""
    cols = {"student": student, **({"repaired": repaired} if repaired is not None else {})}
    same = {who: matching_prefix(teacher, c) for who, c in cols.items()}
    lines = [
        "# Generation check",
        "",
        f"Greedy continuations ({teacher.shape[1]} new tokens, argmax, no sampling) of {len(rows)} prompts "
        f"of {prompt.shape[1]} tokens from the '{set_name}' set, by the teacher and the "
        f"{' and the '.join(cols)}. Written by `zg train evaluate`; `matching` counts the leading tokens "
        "each shares with the teacher.",
        "",
    ]
    for i, row in enumerate(rows):
        match = ", ".join(f"{who} {same[who][i]}/{teacher.shape[1]}" for who in cols)
        lines += [
            f"## Prompt {i + 1} (row {row}; matching {match})",
            "",
            "| prompt | teacher | " + " | ".join(cols) + " |",
            "|---|---|" + "---|" * len(cols),
            f"| {_cell(tok.decode(prompt[i]))} | {_cell(tok.decode(teacher[i]))} | "
            + " | ".join(_cell(tok.decode(c[i])) for c in cols.values())
            + " |",
            "",
        ]
    if not rows:
        lines += ["No prompts (eval.generate_prompts is 0).", ""]
    return "\n".join(lines)

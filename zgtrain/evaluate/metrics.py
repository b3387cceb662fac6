"""Pure evaluation math: per-position NLL, fresh-window context use, normalized boundary error."""

from __future__ import annotations

import torch

__all__ = ["token_nll", "token_nll_top1", "window_nll", "context_targets"]


@torch.no_grad()
def token_nll(model, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N, T-1) float64 NLL of token t+1 given tokens <= t, full context."""
    out = []
    for i in range(0, len(ids), batch_size):
        x = ids[i : i + batch_size].to(model.device)  # (B, T)
        logits = model(input_ids=x).logits[:, :-1].float()  # (B, T-1, V)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        out.append(nll.double().cpu())
    return torch.cat(out)


@torch.no_grad()
def token_nll_top1(model, ids: torch.Tensor, batch_size: int, *, advance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_nll`` (the same numbers, bit for bit) and the (N, T-1) int64 top-1 next token at each position.

    ``advance(n)`` is called with the tokens of each batch (a progress bar)."""
    out, top = [], []
    for i in range(0, len(ids), batch_size):
        x = ids[i : i + batch_size].to(model.device)  # (B, T)
        logits = model(input_ids=x).logits[:, :-1].float()  # (B, T-1, V)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        out.append(nll.double().cpu())
        top.append(logits.argmax(-1).cpu())
        if advance is not None:
            advance(int(x.numel()))
    return torch.cat(out), torch.cat(top)


def context_targets(
    n_seqs: int, seq_len: int, *, k: int, min_pos: int, seed: int, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """(k, 2) sampled (sequence, position) target pairs with position >= min_pos; deterministic in seed.

    ``lengths`` (pad packing): only positions before each row's length are targets."""
    positions = torch.arange(min_pos, seq_len)
    pairs = torch.cartesian_prod(torch.arange(n_seqs), positions)  # (n_seqs * len(positions), 2)
    if lengths is not None:
        pairs = pairs[pairs[:, 1] < lengths[pairs[:, 0]]]
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(pairs), generator=g)[:k]
    return pairs[torch.sort(pick).values]


@torch.no_grad()
def window_nll(
    model, ids: torch.Tensor, targets: torch.Tensor, *, window: int, batch_size: int, advance=None
) -> torch.Tensor:
    """(k,) NLL of each target token seen only through its last ``window`` tokens.

    Each window is a fresh sequence starting at position 0 (not a banded mask: the model
    needs a real first token for its attention sink).
    """
    s, p = targets[:, 0], targets[:, 1]
    offs = torch.arange(-window, 0)  # (W,)
    windows = ids[s.unsqueeze(1), p.unsqueeze(1) + offs]  # (k, W)
    gold = ids[s, p]  # (k,)
    out = []
    for i in range(0, len(windows), batch_size):
        logits = model(input_ids=windows[i : i + batch_size].to(model.device)).logits[:, -1].double()  # (B, V)
        out.append(
            torch.nn.functional.cross_entropy(logits, gold[i : i + batch_size].to(model.device), reduction="none").cpu()
        )
        if advance is not None:
            advance(int(windows[i : i + batch_size].numel()))
    return torch.cat(out)

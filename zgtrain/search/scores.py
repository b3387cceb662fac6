"""Scores of one trained variant that predict an assembled mix, from stored data only (no teacher pass).

"Replace one block" held-out CE (the proxy Puzzle uses): the teacher with only block B swapped for the
variant. Upstream of B the teacher's output on the held-out rows is the stored boundary B.in, so the
variant starts there; downstream, the teacher's own blocks run from their slices
(models/teacher/blocks/*.safetensors, loaded as identity blocks), then the final norm and LM head from
the head slice. The reference runs the same downstream path from the stored boundary B.out, so the
delta measures the variant alone (storage rounding cancels out of it).
"""

from __future__ import annotations

import torch

from zgdata.core.runtime import device
from zgdata.errors import ZgError
from zgdata.families.registry import config_from_dict, family_of
from zgdata.layout import Layout
from zgdata.materialize.virtual import open_pair_in
from zgdata.teacher.prepare import load_slice
from zgdata.tokens.store import open_tokens, read_lengths, read_tokens, real_targets
from zgtrain.block.conversions import identity
from zgtrain.block.load import load_block

__all__ = ["score_variant", "head_module", "teacher_blocks"]

IGNORE = -100  # torch cross_entropy's ignore_index: a padded target


def head_module(layout: Layout):
    """h (B, T, C) -> logits (B, T, V): the teacher's final norm and LM head from the head slice."""
    head, hmeta = load_slice(layout.teacher_head)
    fam = family_of(hmeta["config"])
    config = fam.student_config(hmeta["config"], [1])  # one stub layer: only the norm and the head are used
    with torch.device("meta"):
        model = fam.causal_lm()(config)
    model.load_state_dict({fam.head_key(k): v.float().clone() for k, v in head.items()}, assign=True, strict=False)
    model.tie_weights()
    norm, lm = fam.final_norm(model), model.get_output_embeddings()
    if any(p.is_meta for p in [*norm.parameters(), *lm.parameters()]):
        raise ZgError(f"{layout.teacher_head} lacks the final norm or LM head", fix="re-run `dvc repro teacher`")
    return lambda h: fam.finish_logits(lm(norm(h))), hmeta


def teacher_blocks(project, layout: Layout, keys: list[str]) -> list:
    """The teacher's own blocks KEYS (identity blocks from their slices), in order."""
    out = []
    for key in keys:
        tensors, meta = load_slice(layout.teacher_slice(key))
        out.append(identity(tensors, config_from_dict(meta["config"]), None, None, None).eval())
    return out


@torch.no_grad()
def score_variant(project, block: str, variant: str, *, layout: Layout) -> dict:
    """Held-out CE of the teacher with block BLOCK replaced by the trained variant (``layout`` resolves BLOCK's
    folder to the variant's), the same path from the stored teacher boundary, and their difference."""
    part = project.partition
    cfg = project.variant(block, variant).train
    spec = project.block(block).spec
    head, hmeta = head_module(layout)
    n_layers = hmeta["config"]["num_hidden_layers"]
    if part.boundaries[-1] != n_layers:
        raise ZgError(
            f"partition.boundaries ends at layer {part.boundaries[-1]}, but the teacher has {n_layers}: "
            f"the replace-one-block CE needs teacher blocks up to the head",
            key="partition.boundaries",
            fix=f"end partition.boundaries at {n_layers}",
        )
    keys = [b.key for b in part.blocks()]
    downstream = teacher_blocks(project, layout, keys[keys.index(block) + 1 :])
    swapped, _ = load_block(layout, block, lineage=False)  # the variant this stage just trained
    dev = device()
    for m in (swapped, *downstream):
        m.to(dev)
    x_ds, y_ds = open_pair_in(layout, spec, part, project.materialize)  # h00 may be virtual
    rows, ids = _heldout_targets(layout, layout.boundary(spec.input), x_ds.rows("heldout"), cfg.heldout_rows)
    nll = {"replace": 0.0, "teacher": 0.0}
    count = 0
    for i in range(0, len(rows), cfg.batch_size):
        r = rows[i : i + cfg.batch_size]
        gold = ids[i : i + cfg.batch_size, 1:].to(dev)
        starts = {"replace": swapped(x_ds.take(r).float().to(dev)), "teacher": y_ds.take(r).float().to(dev)}
        for name, h in starts.items():
            for blk in downstream:
                h = blk(h)
            logits = head(h)[:, :-1].float()
            nll[name] += _nll_sum(logits, gold)
        count += int((gold != IGNORE).sum())
    replace_ce, teacher_ce = nll["replace"] / count, nll["teacher"] / count
    return {
        "replace_ce": replace_ce,
        "teacher_ce": teacher_ce,
        "ce_delta": replace_ce - teacher_ce,
        "score_rows": int(len(rows)),
        "score_tokens": int(count),
        "downstream_blocks": keys[keys.index(block) + 1 :],
    }


def _heldout_targets(layout: Layout, where, rows, cap: int):
    """(rows, (N, T) token ids) of the held-out rows scored (the first ``cap``; 0: all), checked against
    data/tokens.lance. Under pad packing a target at or past its row's length is ``IGNORE``: padding is never
    scored, as evaluate scores it."""
    if cap:
        rows = rows[:cap]
    if not len(rows):
        raise ZgError(
            f"{where} has no held-out rows",
            key="corpus.heldout",
            fix="hold out some documents (corpus.heldout) and rerun tokenize and materialize",
        )
    ds = open_tokens(layout)
    ids, splits = read_tokens(layout, rows, ds=ds)
    if set(splits) != {"heldout"}:
        raise ZgError(
            f"rows of {where} do not match data/tokens.lance",
            fix="restore both from one commit, or re-run `dvc repro tokens materialize`",
        )
    lengths = read_lengths(layout, rows, ds=ds)
    if lengths is not None:
        real = real_targets(lengths, ids.shape[1])
        ids = ids.clone()
        ids[:, 1:][~real] = IGNORE
        if not real.any():
            raise ZgError(
                f"the held-out rows of {where} hold no real next-token target (all padding)",
                key="corpus.heldout",
                fix="hold out longer documents (corpus.heldout), or raise the variant's train.heldout_rows",
            )
    return rows, ids


def _nll_sum(logits: torch.Tensor, gold: torch.Tensor) -> float:
    """The summed CE of ``gold`` (B, T) under ``logits`` (B, T, V). On a GPU the per-token losses are summed here:
    cross_entropy's own summing reduction of (B, V, T) logits adds with atomics on CUDA, which torch's strict
    deterministic mode refuses (zgdata/core/runtime.py); on the CPU its reduction stays, and so do the scores' bits."""
    if logits.device.type == "cpu":
        return float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), gold, reduction="sum"))
    return float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), gold, reduction="none").sum())

"""The variant library: every block trained once per named variant, from the same boundary pair.

A variant is ``train:`` with its own overrides (``variants.NAME`` in params.yaml). Training one is a block
training (zgtrain/block/train.py ``train_block``) whose files go under the variant's own folders, so a variant
never touches the main pipeline's block; then zgtrain/search/scores.py adds the scores the search needs.

    models/variants/BLOCK/NAME/          the block's checkpoint folder (as models/blocks/BLOCK/)
    metrics/variants/BLOCK/NAME.json     train metrics + scores
    plots/variants/BLOCK/NAME.csv        loss curve

Its path helpers import no torch (the search stages and `zg train variant` name their files with them), so torch
loads only inside the functions that train and score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from zgdata.core.metrics_file import write_metrics
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = [
    "variant_dir",
    "variant_metrics",
    "variant_plot",
    "search_choice",
    "search_metrics",
    "search_eval_metrics",
    "search_student",
    "VariantLayout",
    "VariantResult",
    "variant_project",
    "train_variant",
    "stage_name",
    "show",
]


def variant_dir(layout: Layout, block: str, variant: str) -> Path:
    return layout.variant_dir(block, variant)


def variant_metrics(layout: Layout, block: str, variant: str) -> Path:
    return layout.variant_metrics(block, variant)


def variant_plot(layout: Layout, block: str, variant: str) -> Path:
    return layout.variant_loss_curve(block, variant)


def search_choice(layout: Layout) -> Path:
    return layout.search_choice


def search_metrics(layout: Layout) -> Path:
    return layout.search_metrics


def search_eval_metrics(layout: Layout) -> Path:
    return layout.search_eval_metrics


def search_student(layout: Layout) -> Path:
    return layout.search_student


def stage_name(block: str, variant: str) -> str:
    """The DVC stage of (block, variant): zgtrain/pipeline/stages.py's ``variant`` foreach keys."""
    return f"variant@{block}-{variant}"


@dataclass(frozen=True)
class VariantLayout(Layout):
    """The project's layout, except that block ``block``'s training files are variant ``variant``'s.

    The trainer writes through ``block_dir`` / ``block_metrics`` / ``block_loss_curve`` only, so this is all
    it takes to train a variant with the unchanged trainer. (Its lock is still the block's: a variant and
    the main training of the same block do not run at once.)"""

    block: str = ""
    variant: str = ""

    def block_dir(self, key: str) -> Path:
        return variant_dir(self, key, self.variant) if key == self.block else super().block_dir(key)

    def block_metrics(self, key: str) -> Path:
        return variant_metrics(self, key, self.variant) if key == self.block else super().block_metrics(key)

    def block_loss_curve(self, key: str) -> Path:
        return variant_plot(self, key, self.variant) if key == self.block else super().block_loss_curve(key)


def variant_project(project, block: str, variant: str):
    """The project as the trainer sees it for (block, variant): block BLOCK's train config is the variant's."""
    run = project.variant(block, variant)
    return replace(project, blocks={**project.blocks, block: run})


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """A variant's training and, once trained, its scores (zgtrain/search/scores.py ``score_variant``);
    ``metrics()`` is metrics/variants/BLOCK/NAME.json. The score fields are None while training is not done."""

    block: str
    variant: str
    training: dict
    """The block training's figures (zgtrain/block/train.py: status, step, steps, params, heldout_loss, ...)."""
    replace_ce: float | None = None
    """Held-out CE of the teacher with this block replaced by the variant."""
    teacher_ce: float | None = None
    """Held-out CE along the same path from the stored teacher boundary."""
    ce_delta: float | None = None
    """replace_ce - teacher_ce: what the search sums."""
    score_rows: int | None = None
    score_tokens: int | None = None
    downstream_blocks: list = field(default_factory=list)
    """The teacher blocks after this one on the scored path."""

    @property
    def status(self) -> str:
        return self.training["status"]

    @property
    def params(self) -> int | None:
        return self.training.get("params")

    def metrics(self) -> dict:
        """The training's figures, the block and variant names and, once done, the scores."""
        if self.status != "done":
            return dict(self.training)
        return {
            **self.training,
            "block": self.block,
            "variant": self.variant,
            "heldout_nmse": self.training["heldout_loss"],
            "replace_ce": self.replace_ce,
            "teacher_ce": self.teacher_ce,
            "ce_delta": self.ce_delta,
            "score_rows": self.score_rows,
            "score_tokens": self.score_tokens,
            "downstream_blocks": self.downstream_blocks,
        }


def train_variant(
    project, block: str, variant: str, *, restart: bool | str = False, layout: Layout = Layout()
) -> VariantResult:
    """Train BLOCK as VARIANT (resuming its own checkpoint), then score it; writes its metrics file."""
    from zgtrain.block.train import train_block
    from zgtrain.search.scores import score_variant

    vl = VariantLayout(root=layout.root, block=block, variant=variant)
    result = train_block(variant_project(project, block, variant), block, restart=restart, layout=vl)
    if result.status != "done":
        return VariantResult(block=block, variant=variant, training=result.metrics())
    out = VariantResult(
        block=block, variant=variant, training=result.metrics(), **score_variant(project, block, variant, layout=vl)
    )
    write_metrics(vl.block_metrics(block), out.metrics())
    return out


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def show(project, *, layout: Layout = Layout(), stale: bool = True) -> dict:
    """Which (block, variant) pairs exist (trained and scored) and which `dvc status` reports stale."""
    pairs = [(b, v) for b in project.blocks for v in project.variants]
    if not pairs:
        raise ZgError(
            "params.yaml has no variant library",
            key="variants",
            fix="add a variants: section (see `zg init --profile tiny-search`) and run `zg pipeline`",
        )
    changed: set[str] = set()
    if stale:
        from zgtrain.exec.repro import stale_stages

        changed = set(stale_stages(layout.root, [stage_name(b, v) for b, v in pairs]))
    rows = []
    for b, v in pairs:
        m = _read(variant_metrics(layout, b, v))
        meta = _read(variant_dir(layout, b, v) / "meta.json")
        rows.append(
            {
                "block": b,
                "variant": v,
                "stage": stage_name(b, v),
                "exists": bool(m and meta and meta.get("done") and "ce_delta" in m),
                "stale": stage_name(b, v) in changed,
                "params": (m or {}).get("params"),
                "ce_delta": (m or {}).get("ce_delta"),
                "heldout_nmse": (m or {}).get("heldout_nmse"),
            }
        )
    return {
        "variants": rows,
        "exist": sum(r["exists"] for r in rows),
        "stale": sum(r["stale"] for r in rows),
        "total": len(rows),
    }

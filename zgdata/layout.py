"""Where every artifact of a conversion project lives, relative to the project root.

DVC runs each stage from the directory holding dvc.yaml, so every path is relative
to the current working directory unless a root is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Layout", "boundary_name"]


def boundary_name(layer: int) -> str:
    """Stable name of the boundary entering decoder layer ``layer`` (``h05``)."""
    return f"h{layer:02d}"


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

    @property
    def params(self) -> Path:
        return self.root / "params.yaml"

    # teacher
    @property
    def teacher_dir(self) -> Path:
        return self.root / "models" / "teacher"

    @property
    def teacher_hf(self) -> Path:
        return self.teacher_dir / "hf"

    @property
    def teacher_json(self) -> Path:
        return self.teacher_dir / "teacher.json"

    def teacher_slice(self, key: str) -> Path:
        return self.teacher_dir / "blocks" / f"{key}.safetensors"

    @property
    def teacher_head(self) -> Path:
        """Embeddings, final norm and LM head: what assembly needs besides the blocks."""
        return self.teacher_dir / "blocks" / "head.safetensors"

    # data
    @property
    def tokens(self) -> Path:
        return self.root / "data" / "tokens.lance"

    @property
    def tokens_json(self) -> Path:
        return self.root / "data" / "tokens.json"

    @property
    def boundaries_dir(self) -> Path:
        return self.root / "data" / "boundaries"

    def boundary(self, name: str) -> Path:
        return self.boundaries_dir / f"{name}.lance"

    @property
    def staging(self) -> Path:
        return self.root / "data" / ".staging"

    @property
    def verify_report(self) -> Path:
        return self.root / "reports" / "verify.json"

    # training
    def block_dir(self, key: str) -> Path:
        return self.root / "models" / "blocks" / key

    def block_metrics(self, key: str) -> Path:
        return self.root / "metrics" / "blocks" / f"{key}.json"

    def block_loss_curve(self, key: str) -> Path:
        return self.root / "plots" / "loss" / f"{key}.csv"

    @property
    def student(self) -> Path:
        return self.root / "models" / "student"

    @property
    def eval_metrics(self) -> Path:
        return self.root / "metrics" / "eval.json"

    @property
    def generation_report(self) -> Path:
        return self.root / "reports" / "generation.md"

    @property
    def eval_plots(self) -> Path:
        return self.root / "plots" / "eval"

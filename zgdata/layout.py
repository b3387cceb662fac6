"""Where every artifact of a conversion project lives, relative to the project root.

DVC runs each stage from the directory holding dvc.yaml, so every path is relative
to the current working directory unless a root is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Layout", "RepairPaths", "boundary_name"]


def boundary_name(layer: int) -> str:
    """Stable name of the boundary entering decoder layer ``layer`` (``h05``)."""
    return f"h{layer:02d}"


@dataclass(frozen=True)
class RepairPaths:
    """The files of one repair run (zgtrain/repair/train.py): the main pipeline's, or the search repair's."""

    run_dir: Path  # meta.json + ckpt-NNNNNN/ (zgtrain/fit/checkpoint.py format), like a block directory
    model: Path  # the repaired student: a transformers folder like models/student
    metrics: Path  # metrics/repair.json: KL before/after on train and held-out rows, state_sha256
    loss_curve: Path  # plots/loss/repair.csv
    lock: str = "repair"  # .zg/locks/<lock>.lock: one run per folder at a time


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
    def sample_jsonl(self) -> Path:
        """The teacher-sampled corpus (``corpus.source: teacher:sample``): one {"id", "text"} object per line."""
        return self.root / "data" / "sample.jsonl"

    @property
    def sample_json(self) -> Path:
        """Its lineage: the teacher, the sampling params, what was dropped as degenerate."""
        return self.root / "data" / "sample.json"

    @property
    def sample_parts(self) -> Path:
        """Finished batches of a sample run, kept until the run ends (a killed run resumes from them)."""
        return self.root / "data" / ".sample.parts"

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

    # repair: global distillation of the assembled student (or of the search's kept mix)
    @property
    def repair(self) -> RepairPaths:
        m = self.root / "models"
        return RepairPaths(
            run_dir=m / "repair",
            model=m / "repaired",
            metrics=self.root / "metrics" / "repair.json",
            loss_curve=self.root / "plots" / "loss" / "repair.csv",
        )

    @property
    def search_repair(self) -> RepairPaths:
        """The search repair's (zgtrain/search/repair.py): the searched student of models/search/student, repaired."""
        m = self.root / "models" / "search"
        return RepairPaths(
            run_dir=m / "repair",
            model=m / "repaired",
            metrics=self.root / "metrics" / "search_repair.json",
            loss_curve=self.root / "plots" / "loss" / "search_repair.csv",
            lock="search-repair",
        )

    # greedy local pretraining (zgtrain/local/): a model trained from scratch, no teacher
    @property
    def local_dir(self) -> Path:
        return self.root / "models" / "local"

    @property
    def local_run(self) -> Path:
        """Simultaneous mode's checkpoints: meta.json + ckpt-NNNNNN/ holding every block's."""
        return self.local_dir / "run"

    @property
    def local_hf(self) -> Path:
        return self.local_dir / "hf"

    @property
    def local_metrics(self) -> Path:
        return self.root / "metrics" / "local.json"

    @property
    def local_loss_curve(self) -> Path:
        return self.root / "plots" / "local" / "loss.csv"

    def local_block_dir(self, key: str) -> Path:
        """Sequential mode: block KEY's checkpoints (zgtrain/fit/checkpoint.py format)."""
        return self.local_dir / "blocks" / key

    def local_block_metrics(self, key: str) -> Path:
        return self.root / "metrics" / "local" / f"{key}.json"

    def local_boundary(self, layer: int) -> Path:
        """Sequential mode: the outputs of the block ending at ``layer`` over every token row."""
        return self.root / "data" / "local" / f"{boundary_name(layer)}.lance"

    @property
    def eval_metrics(self) -> Path:
        return self.root / "metrics" / "eval.json"

    @property
    def generation_report(self) -> Path:
        return self.root / "reports" / "generation.md"

    @property
    def eval_plots(self) -> Path:
        return self.root / "plots" / "eval"

    @property
    def eval_ce_plot(self) -> Path:
        """CE per model (teacher, student, repaired)."""
        return self.eval_plots / "ce.csv"

    @property
    def eval_sets_plot(self) -> Path:
        """CE gap per evaluation set."""
        return self.eval_plots / "sets.csv"

    @property
    def eval_shift_plot(self) -> Path:
        """Boundary shift per block (teacher input against the student's own upstream outputs)."""
        return self.eval_plots / "shift.csv"

    @property
    def eval_figures(self) -> Path:
        """The PNG figures of evaluate: one DVC directory output."""
        return self.eval_plots / "png"

    # lm-evaluation-harness (zgtrain/evaluate/lm_eval.py)
    @property
    def lm_eval_dir(self) -> Path:
        """The zg_nextline task files (zgtrain/evaluate/lm_eval_task.py)."""
        return self.root / "eval" / "lm_eval"

    @property
    def lm_eval_metrics(self) -> Path:
        return self.root / "metrics" / "lm_eval.json"

    @property
    def model_card(self) -> Path:
        """The student's card plus metrics/eval.json's figures (zgtrain/student/card.py), written by evaluate."""
        return self.root / "reports" / "model_card.md"

    # the variant library and the budgeted search over it (zgtrain/search/)
    def variant_dir(self, block: str, variant: str) -> Path:
        return self.root / "models" / "variants" / block / variant

    def variant_metrics(self, block: str, variant: str) -> Path:
        return self.root / "metrics" / "variants" / block / f"{variant}.json"

    def variant_loss_curve(self, block: str, variant: str) -> Path:
        return self.root / "plots" / "variants" / block / f"{variant}.csv"

    @property
    def search_choice(self) -> Path:
        """The chosen mix and the ranked alternatives (zgtrain/search/solve.py)."""
        return self.root / "search" / "choice.json"

    @property
    def search_cost_table(self) -> Path:
        """The measured cost of every block option at search.workload (zgtrain/search/cost.py): the search_cost
        stage's output, read where search.cost or search.limits names latency or kv_cache."""
        return self.root / "search" / "cost" / "table.json"

    @property
    def search_metrics(self) -> Path:
        return self.root / "metrics" / "search.json"

    @property
    def search_eval_metrics(self) -> Path:
        return self.root / "metrics" / "search_eval.json"

    @property
    def search_student(self) -> Path:
        """The searched student: the first mix that passed the gates, else the closest miss."""
        return self.root / "models" / "search" / "student"

    @property
    def students(self) -> dict[str, Path]:
        """The project's student folders by the name `zg export` and the `export` stage take: student (assemble),
        repaired (repair), search (search_assemble)."""
        return {"student": self.student, "repaired": self.repair.model, "search": self.search_student}

    @property
    def stage_folders(self) -> tuple[Path, ...]:
        """The folders that hold the stages' outputs (besides exports): nothing else may be written there, and an
        export is never one of them, inside one, or above one."""
        m = self.root / "models"
        dirs = ("teacher", "blocks", "student", "repaired", "search", "local", "variants")
        return (self.root / "data", *(m / d for d in dirs), *(self.root / d for d in ("metrics", "reports", "plots")))

    def export_dir(self, name: str, dtype: str) -> Path:
        """`zg export`'s default output for a student (name: student, repaired, search) at a dtype."""
        return self.root / "models" / "export" / f"{name}-{dtype}"

    # zg's own files in a project: locks and caches (gitignored, never a DVC output)
    @property
    def state_dir(self) -> Path:
        return self.root / ".zg"

    @property
    def locks_dir(self) -> Path:
        """One advisory lock file per writer (zgdata/core/lock.py)."""
        return self.state_dir / "locks"

    @property
    def teacher_files_cache(self) -> Path:
        """Hashes of the teacher source's files, keyed by inode, size and mtime (zgdata/teacher/identity.py)."""
        return self.state_dir / "cache" / "teacher_files.json"

    @property
    def partial_verify_report(self) -> Path:
        """The report of a `zg data verify` narrower than the verify stage's (--lineage-only, --boundaries): not
        reports/verify.json, the stage's tracked output, which such a check would overwrite with a weaker one."""
        return self.state_dir / "reports" / "verify.json"

    @property
    def trust_cache(self) -> Path:
        """md5s of DVC-tracked files checked against dvc.lock, keyed by inode, size, mtime and ctime (zgdata/trust/dvc_lock.py)."""
        return self.state_dir / "trust.json"

    @property
    def hf_datasets_cache(self) -> Path:
        """datasets' Arrow copy of the lm-eval task files (zgtrain/evaluate/lm_eval_task.py), not in ~/.cache."""
        return self.state_dir / "cache" / "hf_datasets"

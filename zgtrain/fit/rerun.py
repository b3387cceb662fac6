"""What rebuilds a folder zg trained or assembled, and what restores it: the advice of the refusals that name it.

The checkpoint code (zgtrain/fit/checkpoint.py) and the student loader (zgtrain/student/load.py) serve every
trainer and every assembled model: a block, a variant, a sequential local block, simultaneous local pretraining,
the repair and the search's repair; the student, the repaired student and the search's. A refusal names the
command and the DVC stage of the folder it read, found from where the folder lies in the project (the paths of
zgdata/layout.py), so a damaged variant checkpoint does not send its user to `zg train block`. Pure: paths in,
text out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zgdata.errors import dvc_checkout, dvc_pull

__all__ = ["Rerun", "rerun_of", "model_of"]

MODELS = ("models/student", "models/repaired", "models/search/student", "models/search/repaired", "models/local/hf")


@dataclass(frozen=True)
class Rerun:
    """``command``: what (re)trains or rebuilds the folder (``restart``: with the flag that discards its
    checkpoint, where it has one); ``stage``: its DVC stage; ``folder``: the project path `dvc checkout` restores."""

    command: str
    stage: str
    folder: str
    restartable: bool = True

    @property
    def restart(self) -> str:
        return f"{self.command} --restart" if self.restartable else self.command

    def restore(self) -> str:
        """Restore the folder from DVC, or rebuild it from scratch."""
        return f"restore it with `{dvc_checkout(self.folder)}` (or `{dvc_pull(self.folder)}`), or {self.rebuild()}"

    def rebuild(self) -> str:
        return f"rebuild it with {self.commands()}"

    def commands(self) -> str:
        """Its command from scratch, or its stage forced."""
        return f"`{self.restart}` (or `dvc repro -f {self.stage}`)"


def _run_name(part: str) -> str:
    """A run's folder name behind the staging or set-aside folder beside it (``.b01.staging`` -> ``b01``)."""
    for tail in (".staging", ".old"):
        if part.startswith(".") and part.endswith(tail):
            return part[1 : -len(tail)]
    return part


def rerun_of(folder) -> Rerun:
    """The Rerun of a run or model folder (or a file or checkpoint inside it) under a project's ``models/``. A
    folder elsewhere is taken as block training's, named by its last part (what these refusals said before)."""
    parts = Path(folder).parts
    at = max((i for i, p in enumerate(parts) if p == "models"), default=None)
    rel = [_run_name(p) for p in parts[at + 1 :]] if at is not None else []
    head = tuple(rel[:3])
    if head[:1] == ("blocks",) and len(head) >= 2:
        return Rerun(f"zg train block {head[1]}", f"train@{head[1]}", f"models/blocks/{head[1]}")
    if head[:1] == ("variants",) and len(head) == 3:
        b, v = head[1:]
        return Rerun(f"zg train variant {b} {v}", f"variant@{b}-{v}", f"models/variants/{b}/{v}")
    if head[:2] == ("local", "blocks") and len(head) == 3:
        return Rerun(f"zg train local-block {head[2]}", f"local_{head[2]}", f"models/local/blocks/{head[2]}")
    if head[:2] == ("local", "hf"):
        return Rerun("zg train local-export", "local_export", "models/local/hf", restartable=False)
    if head[:1] == ("local",):
        return Rerun("zg train local", "local", "models/local")
    if head[:2] == ("search", "repair"):
        return Rerun("zg search repair", "search_repair", "models/search/repair")
    if head[:2] == ("search", "repaired"):
        return Rerun("zg search repair", "search_repair", "models/search/repaired")
    if head[:2] == ("search", "student"):
        return Rerun("zg search assemble", "search_assemble", "models/search/student", restartable=False)
    if head[:1] == ("repair",):
        return Rerun("zg train repair", "repair", "models/repair")
    if head[:1] == ("repaired",):
        return Rerun("zg train repair", "repair", "models/repaired")
    if head[:1] == ("student",):
        return Rerun("zg train assemble", "assemble", "models/student", restartable=False)
    key = _run_name(Path(folder).name)
    return Rerun(f"zg train block {key}", f"train@{key}", f"models/blocks/{key}")


def model_of(folder) -> Rerun:
    """The Rerun of an assembled model's folder (the student, the repaired one, the search's, local's export); a
    folder elsewhere (a path the user named) is taken as the assembled student's."""
    r = rerun_of(folder)
    return r if r.folder in MODELS else rerun_of("models/student")

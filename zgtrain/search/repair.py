"""Repair the searched student and judge it again: global distillation after the search.

Puzzle's order: local block training, the search over the variant library, then global distillation of the
chosen mix. `zg search repair` (dvc stage `search_repair`, generated only when the project has a variant library
and ``repair.steps > 0``) runs the repair of zgtrain/repair/train.py, with the same ``repair:`` settings, on
models/search/student (the mix search_assemble wrote: the first that passed the gates, else the closest miss)
into models/search/repair and models/search/repaired. The repaired mix is then judged the way search_assemble
judges a try (zgtrain/search/judge.py: every eval set, the gates, the mix at its initial weights as the untrained
reference), and metrics/search_repair.json holds the repair's figures, the verdict before (search_assemble's) and
after, and the share of each set's CE gap that repair closed.

Only the kept mix is repaired, not every try: a repair costs as much as many judgements, and the loop's order
(search_assemble's tries) is by the cheaper pre-repair figures. So the loop can stop at a mix that fails before
repair and passes after; it never goes on to a mix that would have done better after repair.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zgdata.core.metrics_file import write_metrics
from zgdata.core.progress import stderr
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.evaluate.gates import shortfall
from zgtrain.evaluate.repaired import gap_closed
from zgtrain.project.config import ProjectConfig
from zgtrain.search.variants import search_eval_metrics, search_student

__all__ = ["repair_search", "kept_try", "SearchRepairResult"]


@dataclass(frozen=True, kw_only=True)
class SearchRepairResult:
    """The repair of the searched student and, once it is done, the repaired mix's verdict; ``metrics()`` is
    metrics/search_repair.json. The verdict's fields are None while the repair is not done."""

    repair: dict
    """The repair's own figures (zgtrain/repair/train.py: status, step, steps, state_sha256, KL before and after)."""
    mix: dict | None = None
    """{block: variant or 'teacher'}: the mix search_assemble kept."""
    tried: int | None = None
    """Its try number in search_assemble's loop (1-based; "try" in the JSON)."""
    params: int | None = None
    """The mix's blocks' params, as the search counted them."""
    kv_bytes: float | None = None
    passed: bool | None = None
    """The repaired mix passes every gate on every judged set."""
    sets: dict | None = None
    """Every eval set's figures of the repaired mix (zgtrain/search/judge.py ``SET_FIGURES``)."""
    gates_passed: dict | None = None
    miss: float | None = None
    """How far its worst judged gate misses, relative to the threshold (0 when all pass)."""
    ce_gap_closed: dict | None = None
    """Per set: the share of the pre-repair CE gap that repair closed."""
    before: dict | None = None
    """search_assemble's verdict and figures of the mix before repair."""
    unmet: str | None = None
    """When the repaired mix fails: which gate, on which set, by how much."""

    @property
    def status(self) -> str:
        """done, or stopped (``stop_after``): the repair's."""
        return self.repair["status"]

    @property
    def step(self) -> int:
        return self.repair["step"]

    @property
    def steps(self) -> int:
        return self.repair["steps"]

    def metrics(self) -> dict:
        if self.status != "done":
            return dict(self.repair)
        out = {
            **self.repair,
            "mix": self.mix,
            "try": self.tried,
            "params": self.params,
            "kv_bytes": self.kv_bytes,
            "passed": self.passed,
            "sets": self.sets,
            "gates_passed": self.gates_passed,
            "miss": self.miss,
            "ce_gap_closed": self.ce_gap_closed,
            "before": self.before,
        }
        return out if self.unmet is None else {**out, "unmet": self.unmet}


def _read(path, fix: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ZgError(f"{path} is missing or unreadable ({str(e)[:80]})", fix=fix) from e


def kept_try(layout: Layout) -> tuple[int, dict]:
    """(index, entry) of the try search_assemble wrote to models/search/student, checked against its summary."""
    fix = "run `dvc repro search_assemble`"
    report = _read(search_eval_metrics(layout), fix)
    summary = _read(search_student(layout) / "zerograph.json", fix)
    try:
        i = report["selected"] if report["passed"] else report["unmet"]["closest_try"]
        entry = report["tries"][i]
        same = summary["choice"] == entry["mix"] and summary["search"]["try"] == i + 1
    except (KeyError, TypeError, IndexError) as e:
        raise ZgError(f"{search_eval_metrics(layout)} is not a search_assemble report ({e})", fix=fix) from e
    if not same:
        raise ZgError(f"{search_student(layout)} is not the mix {search_eval_metrics(layout)} kept", fix=fix)
    return i, entry


def repair_search(
    project: ProjectConfig, *, stop_after: int | None = None, restart: bool = False, layout: Layout = Layout()
) -> SearchRepairResult:
    """Repair models/search/student (or ``stop_after`` more steps of it), then judge the repaired mix."""
    from zgtrain.repair.train import repair
    from zgtrain.search.assemble import checked_mix, mix_blocks

    i, before = kept_try(layout)
    mix = checked_mix(project, before["mix"], search_eval_metrics(layout))
    paths = layout.search_repair
    res = repair(
        project, stop_after=stop_after, restart=restart, layout=layout, student=search_student(layout), paths=paths
    ).metrics()
    if res["status"] != "done":
        return SearchRepairResult(repair=res)
    from zgtrain.search.judge import MixJudge
    from zgtrain.student.assemble import build_from_blocks
    from zgtrain.student.load import load_student

    judge = MixJudge(project, layout)
    init, _ = build_from_blocks(mix_blocks(project, mix, layout, "init"), layout=layout)
    verdict = judge.judge(load_student(paths.model, lineage=False), init, "repaired")  # written by this stage
    closed = {n: gap_closed(before["sets"][n]["ce_gap"], f["ce_gap"]) for n, f in verdict["sets"].items()}
    passed = verdict["gates_passed"]["all"]
    unmet = None
    if not passed:
        miss, where, gate = shortfall(verdict["gates_passed"])
        v = verdict["gates_passed"][where][gate]
        unmet = (
            f"the repaired mix fails {gate} on {where}: {v['value']:.4f} against {v['threshold']} ({miss:.1%} short)"
        )
        stderr.print(f"warning: {unmet}; raise search.budget or repair.steps, or relax the gates")
    report = SearchRepairResult(
        repair=res,
        mix=mix,
        tried=i + 1,
        params=before["params"],
        kv_bytes=before["kv_bytes"],
        passed=passed,
        sets=verdict["sets"],
        gates_passed=verdict["gates_passed"],
        miss=verdict["miss"],
        ce_gap_closed=closed,
        before={
            "passed": before["gates_passed"]["all"],
            "miss": before["miss"],
            "sets": {
                n: {k: s[k] for k in ("student_ce", "ce_gap", "context_retention")} for n, s in before["sets"].items()
            },
        },
        unmet=unmet,
    )
    write_metrics(paths.metrics, report.metrics())
    return report

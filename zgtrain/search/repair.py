"""Repair the searched student and judge it again: global distillation after the search (issue 14 with issue 15).

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

from zgdata.atomic import write_json
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.progress import stderr
from zgtrain.project.config import ProjectConfig
from zgtrain.repair.judge import gap_closed
from zgtrain.repair.paths import search_repair_paths
from zgtrain.search.variants import search_eval_metrics, search_student

__all__ = ["repair_search", "kept_try"]


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


def repair_search(project: ProjectConfig, *, stop_after: int | None = None, restart: bool = False,
                  layout: Layout = Layout()) -> dict:
    """Repair models/search/student (or ``stop_after`` more steps of it), then judge the repaired mix."""
    from zgtrain.repair.train import repair
    from zgtrain.search.assemble import checked_mix, mix_blocks

    i, before = kept_try(layout)
    mix = checked_mix(project, before["mix"], search_eval_metrics(layout))
    paths = search_repair_paths(layout)
    res = repair(project, stop_after=stop_after, restart=restart, layout=layout, student=search_student(layout),
                 paths=paths)
    if res["status"] != "done":
        return res
    from zgtrain.student.assemble import build_from_blocks
    from zgtrain.search.judge import MixJudge, shortfall
    from zgtrain.student.load import load_student

    judge = MixJudge(project, layout)
    init, _ = build_from_blocks(mix_blocks(project, mix, layout, "init"), layout=layout)
    verdict = judge.judge(load_student(paths.model), init, "repaired")
    closed = {n: gap_closed(before["sets"][n]["ce_gap"], f["ce_gap"]) for n, f in verdict["sets"].items()}
    passed = verdict["gates_passed"]["all"]
    report = {**res, "mix": mix, "try": i + 1, "params": before["params"], "kv_bytes": before["kv_bytes"],
              "passed": passed, **verdict, "ce_gap_closed": closed,
              "before": {"passed": before["gates_passed"]["all"], "miss": before["miss"],
                         "sets": {n: {k: s[k] for k in ("student_ce", "ce_gap", "context_retention")}
                                  for n, s in before["sets"].items()}}}
    if not passed:
        miss, where, gate = shortfall(verdict["gates_passed"])
        v = verdict["gates_passed"][where][gate]
        report["unmet"] = (f"the repaired mix fails {gate} on {where}: {v['value']:.4f} against {v['threshold']} "
                           f"({miss:.1%} short)")
        stderr.print(f"warning: {report['unmet']}; raise search.budget or repair.steps, or relax the gates")
    write_json(paths.metrics, report)
    return report

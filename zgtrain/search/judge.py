"""Judge searched mixes against the gates: the evaluation behind the constraint-aware search loop.

A mix is scored the way `zg train evaluate` scores the student (zgtrain/evaluate/set_metrics.py), on every eval set:
the teacher once, then each mix and the same mix at its blocks' initial weights (the "untrained" reference of
CE recovered; a teacher block's initial weights are the teacher's). A mix passes when every gate passes on
every set ``gates.sets`` names (zgtrain/evaluate/gates.py). When no try passes, ``unmet`` names the budget and the
gates that cannot be met together, and the closest miss: the try whose worst gate misses its threshold by the
smallest relative margin.
"""

from __future__ import annotations

from zgdata.core.progress import stderr
from zgdata.core.runtime import device
from zgdata.families.widen import running_widened
from zgdata.layout import Layout
from zgtrain.evaluate.gates import describe, judge_sets, shortfall
from zgtrain.evaluate.set_metrics import figures, score, targets_for
from zgtrain.project.config import ProjectConfig

__all__ = ["MixJudge", "unmet_report", "SET_FIGURES"]

# the figures of each set that metrics/search_eval.json keeps per try (the study's table: CE, recovered, context)
SET_FIGURES = (
    "teacher_ce",
    "student_ce",
    "untrained_ce",
    "ce_gap",
    "ce_gap_ci95",
    "ce_recovered",
    "context_retention",
    "context_retention_ci95",
    "top1_agreement",
    "ce_tokens",
)


class MixJudge:
    """The eval sets, their context targets and the teacher's scores, loaded once for every try."""

    def __init__(self, project: ProjectConfig, layout: Layout):
        from zgdata.teacher.prepare import load_teacher, load_tokenizer
        from zgtrain.evaluate.run import eval_sets
        from zgtrain.evaluate.sets import heldout_set

        self.cfg, self.gates = project.eval, project.gates
        held, _ = heldout_set(layout, self.cfg.heldout_seqs)
        self.sets = eval_sets(project, layout, held, load_tokenizer(layout))
        self.targets = {s.name: targets_for(s, self.cfg) for s in self.sets}
        teacher = load_teacher(layout, with_tokenizer=False, per_layer=True)[0]
        self.teacher = self._score(teacher, "teacher")
        del teacher

    def _score(self, model, label: str) -> dict:
        model = model.to(device())
        with running_widened(model):
            return {s.name: score(model, label, s, self.targets[s.name], self.cfg) for s in self.sets}

    def judge(self, model, init_model, label: str) -> dict:
        """{"sets": per set figures, "gates_passed": per set verdicts and "all", "miss": relative shortfall}."""
        trained, untrained = self._score(model, label), self._score(init_model, f"{label} (untrained)")
        sets = {}
        for s in self.sets:
            f = figures(
                s,
                {"teacher": self.teacher[s.name], "untrained": untrained[s.name], "student": trained[s.name]},
                self.targets[s.name],
                self.cfg,
            )
            sets[s.name] = {k: f[k] for k in SET_FIGURES}
        gates_passed = judge_sets(self.gates, sets)
        passed = gates_passed["all"]
        miss, where, gate = shortfall(gates_passed)
        stderr.print(f"search: {label} " + ("passes the gates" if passed else f"fails the gates ({gate} on {where})"))
        return {"sets": sets, "gates_passed": gates_passed, "miss": miss}


def unmet_report(project: ProjectConfig, choice: dict, tries: list[dict]) -> dict:
    """Which budget and gates cannot be met together, and the closest miss among the tries."""
    g = project.gates
    k = min(range(len(tries)), key=lambda i: tries[i]["miss"])
    miss, where, gate = shortfall(tries[k]["gates_passed"])
    v = tries[k]["gates_passed"][where][gate]
    message = (
        f"search.budget {choice['budget']} ({choice['budget_unit']} of {choice['cost']}) and the gates "
        f"{describe(g)} on {list(g.sets)} cannot "
        f"be met together by the {len(tries)} best mixes; closest miss: try {k + 1} "
        f"({', '.join(f'{b}={n}' for b, n in tries[k]['mix'].items())}), {gate} {v['value']:.4f} on {where} "
        f"against {v['threshold']} ({miss:.1%} short)"
    )
    return {
        "closest_try": k,
        "set": where,
        "gate": gate,
        "value": v["value"],
        "threshold": v["threshold"],
        "relative_miss": miss,
        "message": message,
        "fix": "raise search.budget, relax the gates, add variants, or raise search.max_tries",
    }

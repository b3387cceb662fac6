"""Assemble the searched mix into a student and judge it: models/search/student/ and metrics/search_eval.json.

Each block is the variant the search chose (models/variants/BLOCK/NAME) or, where it chose ``teacher``, the
teacher's own block from its slice. The model is built and saved exactly as `zg train assemble` does
(zgtrain/student/assemble.py), so mixed MLP widths and windows ship zg's modeling code and `from_pretrained` loads it.

The constraint-aware loop: the best mix of search/choice.json is evaluated on every eval set
(zgtrain/search/judge.py); if it fails a gate, the next-best mixes within the budget (choice.json's ``pool``;
``ranked`` in one written before it) are built and judged in turn, up to ``search.max_tries``. The first that passes
is the student. If none does, the closest miss is written instead, and the report names the budget and gates that
cannot be met together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zgdata.core.lock import project_lock
from zgdata.core.metrics_file import write_metrics
from zgdata.core.progress import stderr
from zgdata.errors import ZgError
from zgdata.families.registry import config_from_dict
from zgdata.layout import Layout
from zgdata.lineage import check, expected_fingerprints
from zgdata.teacher.prepare import load_slice
from zgtrain.block.conversions import identity
from zgtrain.block.load import load_block
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
from zgtrain.search.variants import VariantLayout, search_choice, search_eval_metrics, search_student, stage_name
from zgtrain.student.assemble import StudentResult, build_from_blocks, save_student

__all__ = ["read_choice", "mix_blocks", "assemble_choice", "checked_mix", "SearchAssembleResult"]


@dataclass(frozen=True, kw_only=True)
class SearchAssembleResult:
    """The searched student written and the search loop's report (``report()`` is metrics/search_eval.json)."""

    student: StudentResult
    """models/search/student/: the first mix that passed the gates, else the closest miss."""
    selected: int | None
    """Index of the try that passed the gates (None: none passed)."""
    passed: bool
    tries: list
    """Per try: its mix, the search's and the model's costs, every set's figures, the verdicts and the miss."""
    budget: float
    budget_unit: str
    cost: str
    """What the budget counts: params or kv_bytes (search.cost)."""
    unmet: dict | None
    """When no try passed: the budget and gates that cannot be met together, and the closest miss."""
    written_try: int
    """Index of the try written to models/search/student/."""
    pool: list
    """Each mix of search/choice.json's pool: kept or rejected, and why (gates judged, or not judged)."""
    measured: dict | None = None
    """Where the search used the measured cost table: the kept student timed end to end at search.workload, its
    predicted and measured latency and their relative error."""

    @property
    def path(self) -> str:
        return self.student.path

    def report(self) -> dict:
        """metrics/search_eval.json."""
        return {
            "selected": self.selected,
            "passed": self.passed,
            "tries": self.tries,
            "budget": self.budget,
            "budget_unit": self.budget_unit,
            "cost": self.cost,
            "unmet": self.unmet,
            "pool": self.pool,
            **({"measured": self.measured} if self.measured is not None else {}),
        }

    def metrics(self) -> dict:
        """The student's summary, the report and the written try (what `zg search assemble --json` prints)."""
        return {
            **self.student.metrics(),
            **self.report(),
            "written_try": self.written_try,
            "choice": self.tries[self.written_try]["mix"],
        }


def checked_mix(project: ProjectConfig, mix: dict, path) -> dict[str, str]:
    mix = {b: str(v) for b, v in mix.items()}
    if list(mix) != list(project.blocks) or not set(mix.values()) <= {IDENTITY_VARIANT, *project.variants}:
        raise ZgError(
            f"{path} chooses {mix}, which does not fit params.yaml's blocks and variants",
            fix="rerun the search: `dvc repro search`",
        )
    return mix


def read_choice(project: ProjectConfig, layout: Layout) -> tuple[dict, list[dict[str, str]], list[dict]]:
    """search/choice.json, its pool's mixes ({block: variant or 'teacher'}, best first, checked against params)
    and their entries (params, kv_bytes, predicted_ce_delta)."""
    path = search_choice(layout)
    try:
        choice = json.loads(path.read_text())
        best = {b: o["variant"] for b, o in choice["blocks"].items()}
        ranked = list(choice.get("pool") or choice["ranked"])  # the pool (a choice.json before it: the ranked)
        mixes = [checked_mix(project, r["mix"], path) for r in ranked]
        costs = [{k: r[k] for k in ("params", "kv_bytes", "predicted_ce_delta")} for r in ranked]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ZgError(f"{path} is missing or not a search choice ({str(e)[:80]})", fix="run `dvc repro search`") from e
    if not mixes or mixes[0] != checked_mix(project, best, path):
        raise ZgError(f"{path}: its pool does not start with its choice", fix="rerun `dvc repro search`")
    return choice, mixes, costs


def mix_blocks(
    project: ProjectConfig, mix: dict[str, str], layout: Layout, which: str = "final", *, boundaries: bool = True
) -> list:
    """[(BlockSpec, block, meta)] of a mix: each variant's trained (or ``init``) weights, checked against the current
    boundaries (``boundaries=False``: not, for timing, which reads no boundary), or the teacher's own block."""
    want = expected_fingerprints(layout, project.partition, project.materialize) if boundaries else None
    blocks = []
    for spec in project.partition.blocks():
        name = mix[spec.key]
        if name == IDENTITY_VARIANT:
            tensors, smeta = load_slice(layout.teacher_slice(spec.key))
            block = identity(tensors, config_from_dict(smeta["config"]), None, None, None).eval()
            meta = {"state_sha256": None, "fingerprints": {}, "teacher_layers": smeta["layers"]}
        else:
            block, meta = load_block(
                VariantLayout(root=layout.root, block=spec.key, variant=name), spec.key, which=which
            )
            if want is not None:
                check(
                    f"variant {spec.key}/{name}",
                    meta["fingerprints"],
                    "the current boundaries",
                    want,
                    keys=(spec.input, spec.output),
                    fix=f"it is stale: run `dvc repro {stage_name(spec.key, name)}`",
                )
        blocks.append((spec, block, meta))
    return blocks


def assemble_choice(project: ProjectConfig, *, layout: Layout = Layout()) -> SearchAssembleResult:
    from zgtrain.search.judge import MixJudge, unmet_report

    choice, mixes, ranked = read_choice(project, layout)
    path = search_student(layout)
    with project_lock(layout, "search-assemble", writes=path):
        tries, kept = _try_mixes(project, layout, MixJudge(project, layout), mixes, ranked)
        i, model, summary = kept
        passed = tries[i]["gates_passed"]["all"]
        summary["choice"] = tries[i]["mix"]
        summary["search"] = {"try": i + 1, "tries": len(tries), "gates_passed": passed}
        measured = _timed_kept(project, layout, model, summary, tries[i]["mix"]) if choice.get("measured") else None
        result = SearchAssembleResult(
            student=save_student(model, summary, path, layout=layout, judged=tries[i]),
            selected=i if passed else None,
            passed=passed,
            tries=tries,
            budget=choice["budget"],
            budget_unit=choice["budget_unit"],
            cost=choice["cost"],
            unmet=None if passed else unmet_report(project, choice, tries),
            written_try=i,
            pool=pool_verdicts(mixes, tries, i, project.search.max_tries),
            measured=measured,
        )
        if not passed:
            stderr.print(
                f"warning: {result.unmet['message']}; wrote the closest miss to {path} ({result.unmet['fix']})"
            )
        if measured is not None and measured["warning"]:
            stderr.print(f"warning: {measured['warning']}")
        write_metrics(search_eval_metrics(layout), result.report())
    return result


def _timed_kept(project: ProjectConfig, layout: Layout, model, summary: dict, mix: dict) -> dict:
    """The search used the measured cost table: the kept student timed against its prediction, beside the teacher
    (zgtrain/search/cost.py ``measure_student``)."""
    from zgtrain.search.cost import measure_student

    teacher = build_from_blocks(
        mix_blocks(project, dict.fromkeys(project.blocks, IDENTITY_VARIANT), layout), layout=layout
    )
    return measure_student(project, layout, {"student": (model.cpu(), summary), "teacher": teacher}, mix)


def _try_mixes(project: ProjectConfig, layout: Layout, judge, mixes: list, ranked: list) -> tuple[list, tuple]:
    """Build and judge the pool's mixes in order, up to search.max_tries, until one passes the gates: every try's
    figures, and (index, model, summary) of the first that passes, else of the closest miss."""
    tries, kept = [], None
    for i, mix in enumerate(mixes[: project.search.max_tries]):
        stderr.print(f"search: try {i + 1}: {', '.join(f'{b}={n}' for b, n in mix.items())}")
        model, summary = build_from_blocks(mix_blocks(project, mix, layout), layout=layout)
        init, _ = build_from_blocks(mix_blocks(project, mix, layout, "init"), layout=layout)
        verdict = judge.judge(model, init, f"try {i + 1}")
        del init
        costs = ranked[i]  # the blocks' params and KV bytes/token, as the search counted them
        tries.append(
            {
                "mix": mix,
                "params": costs["params"],
                "kv_bytes": costs["kv_bytes"],
                "predicted_ce_delta": costs["predicted_ce_delta"],
                "model_params": summary["params"],
                "model_param_ratio": summary["param_ratio"],
                "model_kv_ratio": summary["kv_ratio"],
                **verdict,
            }
        )
        if kept is None or verdict["miss"] < tries[kept[0]]["miss"]:
            kept = (i, model, summary)
        if verdict["gates_passed"]["all"]:
            break
    return tries, kept


def pool_verdicts(mixes: list, tries: list, kept: int, max_tries: int) -> list[dict]:
    """Per pool mix: its rank, the mix, whether it was judged and kept, and why (the gates it failed)."""
    from zgtrain.evaluate.gates import failures

    out = []
    for k, mix in enumerate(mixes):
        if k < len(tries):
            t = tries[k]
            ok = t["gates_passed"]["all"]
            failed = [f"{g.key} {v['value']:.4f} vs {v['threshold']} on {n}" for n, g, v in failures(t["gates_passed"])]
            why = (
                "passes the gates: the first that does"
                if ok
                else ("no try passes; the closest miss" if k == kept else "fails " + (", ".join(failed) or "a gate"))
            )
            out.append({"rank": k + 1, "mix": mix, "judged": True, "kept": k == kept, "passed": ok, "why": why})
        else:
            why = (
                f"not judged: try {len(tries)} passed first"
                if tries and tries[-1]["gates_passed"]["all"]
                else f"not judged: beyond search.max_tries ({max_tries})"
            )
            out.append({"rank": k + 1, "mix": mix, "judged": False, "kept": False, "passed": None, "why": why})
    return out

"""`zg train lm-eval`: lm-evaluation-harness (`lm_eval.simple_evaluate`, HF model class) on teacher and student,
and on the repaired student when repair is on (``repair.steps > 0``).

Both models are loaded by zg's own checked loaders and handed to lm-eval's ``HFLM`` as model
objects, so what lm-eval scores is exactly what zg checked: the teacher whose files match
``teacher.json``, and the student, with ``trust_remote_code`` only when its modeling file is zg's
own, pinned by hash (zgtrain/student/load.py). lm-eval never calls ``from_pretrained`` itself.

Offline: zg's own task (``zg_nextline``, zgtrain/evaluate/lm_eval_task.py) is local JSONL. Standard tasks
(hellaswag, arc_easy, piqa, lambada_openai, ...) read their data through `datasets`, which runs
offline under zg (``HF_HUB_OFFLINE=1`` unless the user sets it): with no copy in the local datasets
cache they are refused in one line, before any model is loaded.

Writes ``metrics/lm_eval.json``: per task, each metric for teacher, student (and repaired) and each one's
percentage of the teacher; the task's lineage; the models' identities.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

from zgdata.core.lock import project_lock
from zgdata.core.metrics_file import write_metrics
from zgdata.core.progress import stderr
from zgdata.core.runtime import device
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.evaluate.lm_eval_task import NEXTLINE, task_config, task_files, write_nextline_task

__all__ = ["STANDARD", "PRIMARY", "metrics_path", "lm_eval_tasks", "run_lm_eval", "LmEvalResult"]

# Standard tasks zg knows where to find inside lm_eval/tasks/ (loading only that folder takes a second;
# indexing all of lm-eval's ~15,000 task configs takes 10-40 s). Other names are looked up in the full index.
STANDARD = {
    "hellaswag": "hellaswag",
    "arc_easy": "arc",
    "arc_challenge": "arc",
    "piqa": "piqa",
    "lambada_openai": "lambada",
    "lambada_standard": "lambada",
    "winogrande": "winogrande",
}
# The metric reported as a task's accuracy (all metrics are kept): the usual one for each task.
PRIMARY = {"hellaswag": "acc_norm", "arc_challenge": "acc_norm"}
_INSTALL = "install it with `pip install 'zerograph[eval]'` (or `make setup-dev`)"


@dataclass(frozen=True, kw_only=True)
class LmEvalResult:
    """What `zg train lm-eval` measured; ``metrics()`` is metrics/lm_eval.json."""

    tasks: dict
    """Per task: its primary metric and each model's value of it up top, then every metric (``_task_figures``)."""
    task_lineage: dict
    """zg_nextline's lineage (where it was built from), when it ran."""
    models: dict
    """Each scored model's identity: path, weights or modeling file hash, trust_remote_code."""
    lm_eval: dict
    """How lm-eval ran: its version, model class, num_fewshot, limit, batch size."""
    seconds: float

    def metrics(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def metrics_path(layout: Layout) -> Path:
    return layout.lm_eval_metrics


def lm_eval_tasks(project, tasks: list[str] | None) -> list[str]:
    """The tasks to run: the command line's, else ``lm_eval.tasks``, else zg's own."""
    names = list(tasks or project.lm_eval.tasks or [NEXTLINE])
    return list(dict.fromkeys(names))


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ZgError(f"lm-eval (lm-evaluation-harness) is not installed ({e})", fix=_INSTALL) from e
    for name in ("lm_eval", "lm-eval"):  # its INFO lines, and warnings about how zg calls it on purpose (a model
        logging.getLogger(name).setLevel(logging.ERROR)  # object, not a path; num_fewshot 0), would drown zg's output
    return lm_eval, HFLM, TaskManager


def _task_manager(TaskManager, standard: list[str]):
    import lm_eval.tasks as tasks_pkg

    root = Path(tasks_pkg.__file__).parent
    if all(t in STANDARD for t in standard):
        dirs = sorted({str(root / STANDARD[t]) for t in standard})
        return TaskManager(include_path=dirs or None, include_defaults=False)
    return TaskManager()


def _datasets_cache() -> str:
    try:
        import datasets.config

        return str(datasets.config.HF_DATASETS_CACHE)
    except ImportError:
        return os.environ.get("HF_DATASETS_CACHE", "~/.cache/huggingface/datasets")


def _check_standard(tm, standard: list[str]) -> None:
    """Each standard task is known and its data is in the local datasets cache; else one line, before any model."""
    for name in standard:
        entry = tm.task_index.get(name)
        if entry is None:
            raise ZgError(
                f"lm-eval has no task {name!r}",
                key="lm_eval.tasks",
                fix=f"use {NEXTLINE} or a task name `lm-eval ls tasks` lists (e.g. hellaswag, arc_easy, "
                "piqa, lambada_openai)",
            )
        if getattr(getattr(entry, "kind", None), "name", None) == "TAG":  # no score of its own: its tasks' only
            members = sorted(n for n, e in tm.task_index.items() if name in (getattr(e, "tags", None) or ()))
            raise ZgError(
                f"lm-eval's {name!r} is a tag, a set of tasks with no score of its own ({', '.join(members[:6])}"
                f"{', ...' if len(members) > 6 else ''})",
                key="lm_eval.tasks",
                fix=f"name the tasks themselves, e.g. {members[0] if members else 'lambada_openai'}",
            )
        cfg = entry.cfg or {}
        data = "/".join(str(x) for x in (cfg.get("dataset_path"), cfg.get("dataset_name")) if x)
        try:
            tm.load([name])  # builds the task: `datasets` loads its splits, from the cache when offline
        except (ConnectionError, FileNotFoundError) as e:
            online = os.environ.get("HF_HUB_OFFLINE", "1") in ("0", "false", "False") and os.environ.get(
                "HF_DATASETS_OFFLINE", "0"
            ) in ("0", "false", "False")
            how = "the download failed" if online else "zg runs offline"
            raise ZgError(
                f"lm-eval task {name} needs the dataset {data or '?'}, which is not in the local datasets "
                f"cache ({_datasets_cache()}) and {how} ({type(e).__name__})",
                key="lm_eval.tasks",
                fix=f"fetch it once with network access (`HF_HUB_OFFLINE=0 zg train lm-eval {name}`), or set "
                f"HF_DATASETS_CACHE to a datasets cache that holds it, or drop {name}",
            ) from e


def _scores(out: dict, task: str) -> tuple[dict, dict]:
    """({metric: value}, {metric: stderr}) of one task in simple_evaluate's results."""
    res = out["results"][task]
    vals, errs = {}, {}
    for k, v in res.items():
        if "," not in k or not isinstance(v, (int, float)):
            continue
        name, v = k.split(",", 1)[0], float(v) if math.isfinite(v) else None  # JSON has no NaN
        if name.endswith("_stderr"):
            errs[name.removesuffix("_stderr")] = v
        else:
            vals[name] = v
    return vals, errs


def _pct(student: float | None, teacher: float | None) -> float | None:
    return None if not teacher or student is None else 100.0 * student / teacher


def _task_figures(results: dict, task: str) -> dict:
    """One task's figures: every metric for each scored model (teacher, student and, with repair on, repaired)
    with lm-eval's standard error and each model's percentage of the teacher; the task's primary metric up top."""
    (tv, te) = _scores(results["teacher"], task)
    scored = {who: _scores(r, task) for who, r in results.items() if who != "teacher"}
    metrics = {}
    for m in tv:
        if not all(m in v for v, _ in scored.values()):
            continue
        metrics[m] = {"teacher": tv[m], "teacher_stderr": te.get(m)}
        for who, (v, e) in scored.items():
            metrics[m].update({who: v[m], f"{who}_pct_of_teacher": _pct(v[m], tv[m]), f"{who}_stderr": e.get(m)})
    primary = PRIMARY.get(task, "acc") if PRIMARY.get(task, "acc") in metrics else next(iter(metrics), None)
    n = results["teacher"].get("n-samples", {}).get(task, {})
    top = {k: v for k, v in metrics[primary].items() if not k.endswith("_stderr")} if primary else {}
    return {"metric": primary, **top, "examples": n.get("effective"), "of": n.get("original"), "metrics": metrics}


def _evaluate(lm_eval, lm, specs: list, tm, limit: int | None) -> dict:
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=specs,
        task_manager=tm,
        limit=limit,
        num_fewshot=0,
        log_samples=False,
        bootstrap_iters=1000,
        random_seed=0,
        numpy_random_seed=1234,
        torch_random_seed=1234,
        fewshot_random_seed=1234,
    )


def run_lm_eval(
    project, tasks: list[str] | None = None, *, limit: int | None = None, layout: Layout = Layout()
) -> LmEvalResult:
    out_path = metrics_path(layout)
    with project_lock(layout, "lm_eval", writes=out_path):
        return _run(project, lm_eval_tasks(project, tasks), limit, layout, out_path)


def _run(project, tasks: list[str], limit: int | None, layout: Layout, out_path: Path) -> LmEvalResult:
    from zgdata.families.widen import running_widened
    from zgdata.teacher.prepare import load_teacher, read_teacher_json
    from zgtrain.evaluate.repaired import repaired_loader
    from zgtrain.student.load import load_student

    t0 = time.perf_counter()
    cfg = project.lm_eval
    limit = cfg.limit if limit is None else limit
    lm_eval, HFLM, TaskManager = _import_lm_eval()
    standard = [t for t in tasks if t != NEXTLINE]
    tm = _task_manager(TaskManager, standard)
    _check_standard(tm, standard)
    if not (layout.student / "config.json").exists():  # before anything is written
        raise ZgError(f"{layout.student} not found", fix="run `dvc repro assemble`")
    specs, lineage = [], {}
    if NEXTLINE in tasks:
        lineage[NEXTLINE] = meta = write_nextline_task(cfg, layout)
        files = task_files(layout)
        # absolute paths for this run; the YAML on disk keeps them relative to the project root
        specs.append(task_config(str(files["jsonl"].resolve()), str(layout.hf_datasets_cache.resolve()), meta))
    specs += standard
    results, models = {}, {}
    # the students' folders and checked loaders (load_student checks zg's pinned modeling file before any
    # trust_remote_code; the repaired model is first checked to be repaired from this student, before any run)
    students = {"student": (layout.student, lambda: load_student(layout.student))}
    if project.repair.enabled:
        students["repaired"] = (layout.repair.model, repaired_loader(layout))
    for who in ("teacher", *students):
        stderr.print(f"lm-eval: {who} on {', '.join(tasks)}" + (f" (at most {limit} examples each)" if limit else ""))
        if who == "teacher":
            # the student is scored with the same (checked) tokenizer; a teacher stored narrower than fp32 stays so
            # and is widened one piece at a time while it runs (zgdata.families.widen)
            model, tok = load_teacher(layout, per_layer=True)
            models[who] = {
                "path": str(layout.teacher_hf),
                "weights_sha256": read_teacher_json(layout)["weights_sha256"],
            }
        else:
            folder, load = students[who]
            model = load()
            summary = json.loads((folder / "zerograph.json").read_text())
            remote = bool(json.loads((folder / "config.json").read_text()).get("auto_map"))
            models[who] = {
                "path": str(folder),
                "trust_remote_code": remote,
                "modeling_sha256": summary.get("modeling_sha256") if remote else None,
            }
        lm = HFLM(pretrained=model.to(device()), tokenizer=tok, batch_size=cfg.batch_size)
        with running_widened(model):
            results[who] = _evaluate(lm_eval, lm, specs, tm, limit or None)
        del lm, model
    per_task = {task: _task_figures(results, task) for task in tasks}
    for task in tasks:
        if task == NEXTLINE:
            per_task[task]["chance"] = 1.0 / cfg.choices
    result = LmEvalResult(
        tasks=per_task,
        task_lineage=lineage,
        models=models,
        lm_eval={
            "version": getattr(lm_eval, "__version__", None),
            "model": "hf",
            "num_fewshot": 0,
            "limit": limit or None,
            "batch_size": cfg.batch_size,
        },
        seconds=time.perf_counter() - t0,
    )
    write_metrics(out_path, result.metrics())
    return result

"""The measured cost table: every block option's latency and KV-cache bytes at ``search.workload``, on its runtime.

For each option (the teacher block, then each variant) one model is built with that option in every block (the
variant's trained weights, or the teacher's slices: the real shapes) and timed beside the teacher's model
(zgtrain/search/table.py; torch: zgtrain/search/measure.py, per layer; llama.cpp: zgtrain/search/llamacpp.py,
whole models split by layer count). Each block's cost is the summed time of its decoder layers; the embedding,
the final norm and the head (the "base") are measured once, on the teacher, as its total minus its layers (on
llama.cpp: from the teacher and the teacher cut after its first block). A mix is predicted to cost
base + the sum of its blocks' costs (``predict``); every uniform model's measured total is kept beside its
prediction (``additivity``), which says how far that sum can be trusted on this machine.

Per option and phase the table keeps the median over the timed runs, their min and max and ``spread`` =
(max - min) / median: the noise of this machine while it timed. Phases: ``prefill_ms`` (the prompt),
``decode_ms`` (per generated token, the mean over the steps) and ``request_ms`` (prefill + every step: one
request). ``kv_cache`` is the KV-cache bytes of the workload's sequences at their final length (batch x
(prompt + generate) positions, counted as zgtrain/block/kv_cache.py counts them: windows cache at most their
window, a linear_attention layer its constant state).

search/cost/table.json (the ``search_cost`` stage, layout.search_cost_table) is keyed by the runtime, the
machine's kind and the workload; the search refuses a table whose workload or options differ from params.yaml's.
"""

from __future__ import annotations

import json
import statistics
from contextlib import ExitStack, contextmanager
from pathlib import Path

from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig

__all__ = [
    "machine",
    "stats",
    "phases",
    "normalize_runs",
    "opened",
    "round_robin",
    "TOTALS",
    "block_costs",
    "base_cost",
    "predict",
    "read_table",
    "options",
    "measure_student",
    "table_rows",
    "PHASES",
    "FIX",
    "WARN_ERROR",
]

PHASES = ("prefill_ms", "decode_ms", "request_ms")
TOTALS = ("prefill_total", "decode_total")  # a timed run's seconds: the prompt, and every decode step together
FIX = "run `dvc repro search_cost` (after `zg pipeline`, which adds that stage), or `zg search costs --measure`"


def machine(runtime: str, threads: int) -> dict:
    """What the table is keyed by besides the workload: the runtime and this machine's kind (CPU model, cores,
    the timing runtime's version: torch's, or llama-cpp-python's; threads). Reads no module it would have to
    import (the versions come from the packages' metadata)."""
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or ""
    try:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), cpu
        )
    except OSError:
        pass

    def version_of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "?"

    torch_version, cores = version_of("torch"), os.cpu_count() or 0
    # the runtime that timed: torch, or llama-cpp-python (its bundled llama.cpp) for the llama.cpp runtime
    llama = {} if runtime == "torch" else {"llama_cpp_python": version_of("llama_cpp_python")}
    timed_by = f"llama-cpp-python {llama['llama_cpp_python']}" if llama else f"torch {torch_version}"
    return {
        "runtime": runtime,
        "device": "cpu",
        "cpu": cpu,
        "arch": platform.machine(),
        "cores": cores,
        "threads": threads,
        "torch": torch_version,
        **llama,
        "kind": f"{platform.machine()} {cpu} ({cores} cores), {timed_by} cpu x{threads}",
    }


def normalize_runs(runs: list[dict], factor: dict) -> list[dict]:
    """Runs scaled per phase by ``factor`` ({prefill_total, decode_total}: the teacher's median over all of a
    stage's runs over its median beside these runs), per-layer times (torch) too: drift taken out."""
    out = []
    for r in runs:
        n = {k: r[k] * factor[k] for k in TOTALS}
        for per, k in (("prefill", "prefill_total"), ("decode", "decode_total")):
            if per in r:
                n[per] = [x * factor[k] for x in r[per]]
        out.append(n)
    return out


def stats(xs: list[float]) -> dict:
    """Median, min, max and spread ((max - min) / median) of repeated timings."""
    med = statistics.median(xs)
    return {"median": med, "min": min(xs), "max": max(xs), "spread": (max(xs) - min(xs)) / med if med else 0.0}


def phases(prefill: list[float], decode: list[float], generate: int) -> dict:
    """Per-run seconds (prefill, decode summed over the steps) -> the three phases' stats, in ms."""
    return {
        "prefill_ms": stats([1e3 * p for p in prefill]),
        "decode_ms": stats([1e3 * d / generate for d in decode]),
        "request_ms": stats([1e3 * (p + d) for p, d in zip(prefill, decode)]),
    }


def block_costs(runs: list[dict], spans: dict[str, tuple[int, int]], generate: int) -> dict:
    """{block: phase stats} of one model's timed runs: each block's layers [start, end) summed per run."""
    return {
        b: phases([sum(r["prefill"][s:e]) for r in runs], [sum(r["decode"][s:e]) for r in runs], generate)
        for b, (s, e) in spans.items()
    }


def base_cost(runs: list[dict], generate: int) -> dict:
    """What a model costs besides its decoder layers (embedding, final norm, head, the glue): total - layers."""
    return phases(
        [r["prefill_total"] - sum(r["prefill"]) for r in runs],
        [r["decode_total"] - sum(r["decode"]) for r in runs],
        generate,
    )


def predict(table: dict, mix: dict[str, str], phase: str = "request_ms") -> float:
    """A mix's predicted milliseconds in a phase: the base plus each block's chosen option (medians)."""
    return table["base"][phase]["median"] + sum(table["blocks"][b][o][phase]["median"] for b, o in mix.items())


def options(project: ProjectConfig) -> list[str]:
    return [IDENTITY_VARIANT, *project.variants]


def read_table(project: ProjectConfig, layout: Layout) -> dict:
    """search/cost/table.json, checked against params.yaml's workload, blocks and variants."""
    path = layout.search_cost_table
    try:
        table = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{path} is missing or unreadable (search.cost or search.limits needs it)", fix=FIX) from e
    want = project.search.served.as_dict()
    if table.get("workload") != want:
        raise ZgError(f"{path} was measured at workload {table.get('workload')}, not search.workload {want}", fix=FIX)
    got = {b: sorted(o) for b, o in table.get("blocks", {}).items()}  # the file's keys are sorted
    if got != {b: sorted(options(project)) for b in project.blocks}:
        raise ZgError(f"{path} does not cover params.yaml's blocks and variants", fix=FIX)
    here = machine(want["runtime"], want["threads"])["kind"]
    if table.get("machine", {}).get("kind") != here:  # a table is the timing of the machine that measured it
        from zgdata.core.progress import stderr

        stderr.print(
            f"warning: {path} was measured on {table.get('machine', {}).get('kind')}, this is {here}: its "
            "latencies are that machine's (`dvc repro -f search_cost` measures here)"
        )
    return table


WARN_ERROR = 0.15  # a predicted latency further than this from the measured one is a warning in the report


def measure_student(project: ProjectConfig, layout: Layout, models: dict, mix: dict) -> dict:
    """The searched student timed end to end at search.workload on its runtime (llama.cpp: exported to GGUF as
    the table's models were), interleaved run by run with the teacher (``models``: {"student", "teacher"}: (model,
    summary)), so that both see the same machine. Per phase: the table's prediction (base + blocks) against the
    measurement (``error``), and the student/teacher ratio predicted against measured (``relative_error``: what
    the table predicts once the machine's drift since it was measured, seen on the teacher, is taken out). A
    relative error beyond WARN_ERROR in the searched phase is a warning; so is a drift beyond it."""
    table, w = read_table(project, layout), project.search.served
    runs = _interleaved_runs(layout, models, w)
    phase, teacher_mix = f"{w.phase}_ms", dict.fromkeys(mix, IDENTITY_VARIANT)
    out = {}
    for p in PHASES:
        got = {
            k: phases([r["prefill_total"] for r in v], [r["decode_total"] for r in v], w.generate)
            for k, v in runs.items()
        }
        pred, pred_t = predict(table, mix, p), predict(table, teacher_mix, p)
        meas, meas_t = got["student"][p]["median"], got["teacher"][p]["median"]
        out[p] = {
            "predicted": pred,
            "measured": got["student"][p],
            "error": meas / pred - 1,
            "teacher_predicted": pred_t,
            "teacher_measured": got["teacher"][p],
            "drift": meas_t / pred_t - 1,
            "relative_error": (meas / meas_t) / (pred / pred_t) - 1,
        }
    m = out[phase]
    warnings = []
    if abs(m["relative_error"]) > WARN_ERROR:
        warnings.append(
            f"the searched student's measured {phase} is {m['relative_error']:+.0%} off the cost table's prediction "
            f"relative to the teacher timed alongside it ({m['measured']['median']:.3f} against "
            f"{m['predicted']:.3f} predicted; spread across repeats {m['measured']['spread']:.0%})"
        )
    if abs(m["drift"]) > WARN_ERROR:
        warnings.append(
            f"the teacher ran {m['drift']:+.0%} off its time in the cost table ({phase}): the machine is not as it "
            "was when the table was measured (a shared machine's load?); the absolute error "
            f"{m['error']:+.0%} includes that drift"
        )
    return {
        "phase": phase,
        "machine": table["machine"]["kind"],
        **out,
        "error": m["error"],
        "relative_error": m["relative_error"],
        "drift": m["drift"],
        "warning": "; ".join(warnings) or None,
    }


def round_robin(runners: dict, rounds: int, warmup: int, on_round=None) -> dict[str, list]:
    """{name: runs}: ``runners`` (name -> ``run(warmup, repeats)``) one run each in turn, ``rounds`` rounds, the
    warm-ups in the first; so a drift of a shared machine meets every runner alike. ``on_round(i)`` after each."""
    out: dict[str, list] = {k: [] for k in runners}
    for i in range(rounds):
        for k, run in runners.items():
            out[k] += run(warmup if i == 0 else 0, 1)
        if on_round is not None:
            on_round(i)
    return out


def _interleaved_runs(layout: Layout, models: dict, w) -> dict[str, list]:
    """{name: runs} of each model, one run of each in turn, ``w.repeats`` rounds (warm-ups in the first)."""
    with ExitStack() as stack:
        runners = {k: stack.enter_context(_runner(layout, model, summary, w)) for k, (model, summary) in models.items()}
        return round_robin(runners, w.repeats, w.warmup)


@contextmanager
def opened(model, summary: dict, w, folder: Path, layout: Layout):
    """Yields ``run(warmup, repeats)`` of a model on the workload's runtime, or the reason it cannot run there
    (llama.cpp: what the GGUF export refused; its file goes to ``folder``)."""
    if w.runtime != "llama.cpp":
        from zgdata.families.registry import family_of
        from zgtrain.search.measure import timed_runs

        layers = family_of(model.config).layers(model)
        kw = {"batch": w.batch, "prompt": w.prompt, "generate": w.generate, "threads": w.threads}
        yield lambda warmup, repeats: timed_runs(model, layers, warmup=warmup, repeats=repeats, **kw)
        return
    from zgdata.teacher.prepare import load_tokenizer, read_teacher_json
    from zgtrain.search.llamacpp import export_for_timing, llama_timer

    sha = read_teacher_json(layout)["weights_sha256"]
    gguf = export_for_timing(model, summary, folder, load_tokenizer(layout), sha)
    if isinstance(gguf, str):
        yield gguf
        return
    kw = {"prompt": w.prompt, "generate": w.generate, "threads": w.threads}
    with llama_timer(gguf, vocab=model.config.vocab_size, **kw) as run:
        yield run


@contextmanager
def _runner(layout: Layout, model, summary: dict, w):
    """``run(warmup, repeats)`` of a model on the workload's runtime; a model llama.cpp cannot take is an error."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zg-cost-") as tmp, opened(model, summary, w, Path(tmp), layout) as run:
        if isinstance(run, str):
            raise ZgError(f"the searched student cannot be exported to GGUF: {run}", fix="use runtime: torch")
        yield run


def table_rows(table: dict, phase: str) -> list[dict]:
    """One row per (block, option): its phase median and spread (None where the runtime cannot run it, with
    ``why``), its KV-cache bytes; the base first."""
    rows = [{"block": "(base)", "option": "embedding + head", **_row(table["base"], phase), "kv_cache": 0.0}]
    for b, opts in table["blocks"].items():
        rows += [{"block": b, "option": o, **_row(c, phase), "kv_cache": c["kv_cache"]} for o, c in opts.items()]
    return rows


def _row(cost: dict, phase: str) -> dict:
    if not cost.get("expressible", True):
        return {"ms": None, "spread": None, "why": cost["why"]}
    return {"ms": cost[phase]["median"], "spread": cost[phase]["spread"]}

"""The `zg` command tree (typer): each command parses its arguments, builds the typed config, calls one stage
function and renders its typed result. zgtrain.cli.main runs it (and answers help without importing it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from zgdata.cli import GROUP, data_app, emit, params_option, teacher_app
from zgtrain.search.cli import search_app

# --restart of the commands that resume a training checkpoint: it never reads the old one, whichever run wrote it
RESTART_HELP = (
    "discard the checkpoint, of this {what} or another, and start at step 0 (without it, one of another {what} "
    "is refused)."
)

__all__ = ["app"]

app = typer.Typer(
    name="zg",
    add_completion=False,
    **GROUP,
    help="ZeroGraph: convert or distil a language model block by block from materialized teacher "
    "boundaries (Lance datasets, tracked by DVC). Run `dvc repro` in a project; see `zg init`.",
)
train_app = typer.Typer(help="Train blocks, assemble the student, evaluate it.", **GROUP)
app.add_typer(teacher_app, name="teacher")
app.add_typer(data_app, name="data")
app.add_typer(train_app, name="train")
app.add_typer(search_app, name="search")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="show tracebacks (also ZG_DEBUG=1).")):
    if debug:
        os.environ["ZG_DEBUG"] = "1"


@app.command("init")
def init(
    directory: Path = typer.Argument(..., help="new project directory."),
    profile: str = typer.Option(
        "smollm2",
        help="smollm2 (the default conversion), tiny (seconds, for tries and tests), "
        "local (greedy local pretraining from scratch) or local-tiny; "
        "search / tiny-search (the same plus a variant library).",
    ),
):
    """Scaffold a conversion project in DIRECTORY (git, dvc init, params.yaml, dvc.yaml). Then: cd DIRECTORY && dvc repro."""
    from zgdata.core.progress import stderr
    from zgtrain.pipeline.scaffold import init_project

    root = init_project(directory, profile)
    stderr.print(f"project ready in {root} (profile {profile}); next: cd {root} && dvc repro")


@app.command("pipeline")
def pipeline(params: Path = params_option):
    """Regenerate dvc.yaml (and blocks: keys) after editing partition.boundaries in params.yaml.

    params.yaml is rewritten with the values it holds, in zg's layout: its YAML comments are not kept."""
    from zgdata.core.progress import stderr
    from zgtrain.pipeline.scaffold import regenerate

    path, project = regenerate(params)
    stderr.print(f"wrote {path} with blocks {', '.join(b.key for b in project.partition.blocks())}")


@app.command("params")
def params_doc(
    keys: list[str] | None = typer.Argument(
        None, help="keys or sections to show (e.g. train, train.lr; default: all)."
    ),
    as_json: bool = typer.Option(False, "--json", help="a JSON list of {key, default, meaning}."),
):
    """Explain every params.yaml key: its default (from the config dataclasses) and allowed values.

    A table on a terminal; piped, one tab-separated line per key (key, default, meaning), nothing cut short."""
    from zgdata.errors import ZgError
    from zgtrain.project.config import params_rows  # one source for this table and docs/reference/params.md

    rows = params_rows()
    if keys:
        rows = [r for r in rows if any(r[0] == k or r[0].startswith(k.rstrip(".") + ".") for k in keys)]
        if not rows:
            raise ZgError(f"no params key or section {', '.join(keys)}", fix="run `zg params` for every key")
    if as_json:
        emit([{"key": k, "default": d, "meaning": m} for k, d, m in rows], as_json=True, summary="")
    elif not sys.stdout.isatty():
        for row in rows:
            print("\t".join(row))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table("key", "default", "meaning", show_lines=False)
        for key, default, doc in rows:
            table.add_row(key, escape(default), escape(doc))
        Console().print(table)


@app.command("repro")
def repro(
    targets: list[str] | None = typer.Argument(None, help="stages to bring up to date (default: all)."),
    jobs: int = typer.Option(
        1,
        "--jobs",
        "-j",
        min=1,
        help="blocks trained at once (1, without --address or --data remote: in this process, no Ray).",
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        help="join this Ray cluster (default: ZG_RAY_ADDRESS or RAY_ADDRESS, else start a local one sized by --jobs).",
    ),
    data: str = typer.Option(
        "shared",
        "--data",
        help="shared: workers see the project's file system; remote: they clone it and use the DVC remote.",
    ),
    as_json: bool = typer.Option(False, "--json"),
):
    """Like `dvc repro`, with up to --jobs stale blocks trained at once (Ray); each is recorded in dvc.lock."""
    from zgtrain.exec.repro import repro as run
    from zgtrain.pipeline.current import check

    check(Path.cwd())  # a stale dvc.yaml is refused before any stage runs
    r = run(Path.cwd(), list(targets or []), jobs=jobs, address=address, data=data)
    restored = f"; restored from DVC's run cache: {', '.join(r.restored)}" if r.restored else ""
    emit(r.metrics(), as_json=as_json, summary=f"ran: {', '.join(r.ran) or 'nothing'}{restored} in {r.seconds:.0f} s")


@train_app.command("block")
def train_block(
    key: str = typer.Argument(..., help="block key, e.g. b00."),
    targets: str | None = typer.Option(None, help="cached or online (default train.targets)."),
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="run at most N (>= 1) more steps, checkpoint, exit 0; rerun to resume."
    ),
    restart: bool = typer.Option(False, "--restart", help=RESTART_HELP.format(what="config")),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Train block KEY alone from its boundary pair (blocks.KEY over train: defaults). Resumes from its checkpoint."""
    from zgdata.config import check_field, check_int
    from zgtrain.project.config import ProjectConfig, TrainConfig

    # usage errors before torch loads
    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)
    targets = None if targets is None else check_field("--targets", TrainConfig, "targets", targets)
    from zgtrain.block.train import train_block as run

    r = run(ProjectConfig.load(params), key, targets=targets, stop_after=stop_after, restart=restart)
    loss = "n/a (no steps)" if r.train_loss is None else f"{r.train_loss:.4g}"
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"{key}: {r.status} at step {r.step}/{r.steps}, train_loss {loss}, state {r.state_sha256[:12]}",
    )


@train_app.command("local")
def train_local(
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="run at most N (>= 1) more steps, checkpoint, exit 0; rerun to resume."
    ),
    restart: bool = typer.Option(False, "--restart", help=RESTART_HELP.format(what="config")),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Greedy local pretraining (`local:`): train a Llama from scratch as K isolated blocks; writes models/local/hf."""
    from zgdata.config import check_int

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)  # before torch loads
    from zgtrain.local.simultaneous import train_local as run
    from zgtrain.project.config import ProjectConfig

    r = run(ProjectConfig.load(params), stop_after=stop_after, restart=restart)
    ce = f", held-out CE {r.heldout_ce:.4f}" if r.status == "done" else ""
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"local ({r.k} blocks): {r.status} at step {r.step}/{r.steps}{ce}, state {r.state_sha256[:12]}",
    )


@train_app.command("local-block")
def train_local_block(
    key: str = typer.Argument(..., help="block key, e.g. b01."),
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="run at most N (>= 1) more steps, checkpoint, exit 0."
    ),
    restart: bool = typer.Option(False, "--restart", help=RESTART_HELP.format(what="run")),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Sequential local pretraining (local.mode: sequential): train block KEY from its input dataset, write its outputs."""
    from zgdata.config import check_int

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)  # before torch loads
    from zgtrain.local.sequential import train_block as run
    from zgtrain.project.config import ProjectConfig

    r = run(ProjectConfig.load(params), key, stop_after=stop_after, restart=restart)
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"local {key}: {r.status} at step {r.step}/{r.steps}, state {r.state_sha256[:12]}",
    )


@train_app.command("local-export")
def train_local_export(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Sequential local pretraining: every trained block into models/local/hf; held-out CE into metrics/local.json."""
    from zgtrain.local.sequential import export
    from zgtrain.project.config import ProjectConfig

    r = export(ProjectConfig.load(params))
    emit(r.metrics(), as_json=as_json, summary=f"local ({r.k} blocks, sequential): held-out CE {r.heldout_ce:.4f}")


@train_app.command("variant")
def train_variant(
    key: str = typer.Argument(..., help="block key, e.g. b00."),
    variant: str = typer.Argument(..., help="variant name (params.yaml variants:)."),
    restart: bool = typer.Option(False, "--restart", help=RESTART_HELP.format(what="config")),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Train block KEY as VARIANT (train: + variants.VARIANT) into models/variants/KEY/VARIANT, then score it."""
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.variants import train_variant as run

    r = run(ProjectConfig.load(params), key, variant, restart=restart)
    delta = float("nan") if r.ce_delta is None else r.ce_delta
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"{key}/{variant}: {r.status}, {r.params or 0:,} params, replace-one-block CE delta {delta:+.4f}",
    )


@train_app.command("assemble")
def train_assemble(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Build models/student/: teacher embeddings + trained blocks + final norm + LM head (from_pretrained loads it)."""
    from zgtrain.project.config import ProjectConfig
    from zgtrain.student.assemble import assemble

    r = assemble(ProjectConfig.load(params))
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"student: {r.params:,} params ({r.param_ratio:.2f} of teacher) -> {r.path}",
    )


@train_app.command("repair")
def train_repair(
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="run at most N (>= 1) more steps, checkpoint, exit 0."
    ),
    restart: bool = typer.Option(False, "--restart", help="discard models/repair's checkpoint."),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Repair (repair.steps > 0): distil models/student on the teacher's logits (head slice on the last boundary),
    train split only. Writes models/repaired; resumes from models/repair's checkpoint."""
    from zgdata.config import check_int
    from zgtrain.project.config import ProjectConfig
    from zgtrain.repair.train import repair

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)
    r = repair(ProjectConfig.load(params), stop_after=stop_after, restart=restart)
    kl = f", train KL {r.kl_train_before:.4g} -> {r.kl_train_after:.4g}" if r.status == "done" else ""
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"repair: {r.status} at step {r.step}/{r.steps}{kl}, state {r.state_sha256[:12]}",
    )


@train_app.command("evaluate")
def train_evaluate(
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when a gate fails (CI use)."),
):
    """Held-out CE, context use and boundary shift of teacher vs student; gates from `gates:`. Writes metrics/eval.json."""
    from zgtrain.evaluate.gates import failures
    from zgtrain.evaluate.run import evaluate
    from zgtrain.project.config import ProjectConfig

    r = evaluate(ProjectConfig.load(params))
    verdict = "PASS" if r.gates_passed["all"] else "FAIL"
    # the figures of the model the gates judge: the repaired one when repair is on (its own per-set figures)
    if r.gated_model == "repaired":
        gated, figs = (
            "repaired",
            {n: (f["ce"], f["ce_gap"], f["context_retention"]) for n, f in r.repaired["sets"].items()},
        )
    else:
        gated, figs = "student", {n: (f["student_ce"], f["ce_gap"], f["context_retention"]) for n, f in r.sets.items()}
    ce, gap, retention = figs["heldout"]
    others = "".join(f"; {n}: gap {g:.3f}, retention {k:.2f}" for n, (_, g, k) in figs.items() if n != "heldout")
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"gates {verdict} ({gated}): teacher CE {r.teacher_ce:.3f}, {gated} CE {ce:.3f} (gap {gap:.3f}), "
        f"context retention {retention:.2f}{others}",
    )
    for set_name, gate, g in failures(r.gates_passed):
        print(
            f"gate gates.{gate.key} failed on eval set '{set_name}': measured {g['value']:.4g}, needs {gate.op} "
            f"{g['threshold']}",
            file=sys.stderr,
        )
    if strict and not r.gates_passed["all"]:
        raise typer.Exit(1)


@train_app.command("lm-eval")
def train_lm_eval(
    tasks: list[str] | None = typer.Argument(
        None, help="lm-eval tasks (default: lm_eval.tasks, else zg_nextline, built from the held-out split)."
    ),
    limit: int | None = typer.Option(None, "--limit", help="examples per task (default lm_eval.limit; 0: all)."),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """lm-evaluation-harness on teacher, student and (with repair on) repaired: HF model class, local folders.

    Writes metrics/lm_eval.json."""
    from zgdata.config import check_int
    from zgtrain.evaluate.lm_eval import run_lm_eval
    from zgtrain.project.config import ProjectConfig

    limit = None if limit is None else check_int("--limit", limit, ge=0)
    r = run_lm_eval(ProjectConfig.load(params), tasks, limit=limit)
    parts = [
        f"{t} {v['metric']} teacher {v['teacher']:.3f} student {v['student']:.3f}"
        + (f" ({v['student_pct_of_teacher']:.0f}% of teacher)" if v["student_pct_of_teacher"] is not None else "")
        for t, v in r.tasks.items()
        if v.get("metric") and v["teacher"] is not None and v["student"] is not None
    ]
    emit(r.metrics(), as_json=as_json, summary="; ".join(parts) or "lm-eval: no accuracy metric reported")


@app.command("export")
def export_student(
    student: str = typer.Argument(
        "student", help="student, repaired, search (the project's folders) or a student folder's path."
    ),
    fmt: str = typer.Option("hf", "--format", help="hf (a stock transformers folder) or gguf (llama.cpp)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="output folder, inside the project or anywhere else (default: models/export/NAME-DTYPE); with "
        "--format gguf a path ending in .gguf is the file itself. Replaces only a previous export of zg.",
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="f32, f16, bf16, or q8_0 (gguf only); default: f32 for hf, f16 for gguf."
    ),
    as_json: bool = typer.Option(False, "--json"),
):
    """Export STUDENT as a deployable model: a stock transformers folder (loads without trust_remote_code) or a
    GGUF file, with export.json (lineage) and a model card beside it (--out FILE.gguf: FILE.gguf.export.json beside
    it, no card). Refuses with one line, writing nothing,
    what the format cannot express (e.g. per-layer MLP widths in a stock config)."""
    from zgtrain.export.run import export

    r = export(student, fmt, out, dtype)
    emit(r.metrics(), as_json=as_json, summary=f"exported {r.student} as {r.format} ({r.dtype}) -> {r.path}")

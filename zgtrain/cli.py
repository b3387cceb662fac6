"""The `zg` command: a thin dispatch layer (parse, build config, call, render)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from typer._click import exceptions as click_exc  # typer raises its own copy of click's exceptions

from zgdata.cli import data_app, emit, params_option, teacher_app
from zgdata.errors import ZgError, from_os_error
from zgdata.progress import stderr

__all__ = ["app", "main"]

app = typer.Typer(name="zg", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  help="ZeroGraph: convert or distil a language model block by block from materialized teacher "
                       "boundaries (Lance datasets, tracked by DVC). Run `dvc repro` in a project; see `zg init`.")
train_app = typer.Typer(help="Train blocks, assemble the student, evaluate it.", no_args_is_help=True,
                        pretty_exceptions_enable=False)
app.add_typer(teacher_app, name="teacher")
app.add_typer(data_app, name="data")
app.add_typer(train_app, name="train")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="show tracebacks (also ZG_DEBUG=1).")):
    if debug:
        os.environ["ZG_DEBUG"] = "1"


@app.command("init")
def init(directory: Path = typer.Argument(..., help="new project directory."),
         profile: str = typer.Option("smollm2", help="smollm2 (the default conversion) or tiny (seconds, for tries and tests).")):
    """Scaffold a conversion project in DIRECTORY (git, dvc init, params.yaml, dvc.yaml). Then: cd DIRECTORY && dvc repro."""
    from zgtrain.pipeline import init_project

    root = init_project(directory, profile)
    stderr.print(f"project ready in {root} (profile {profile}); next: cd {root} && dvc repro")


@app.command("pipeline")
def pipeline(params: Path = params_option):
    """Regenerate dvc.yaml (and blocks: keys) after editing partition.boundaries in params.yaml."""
    from zgdata.atomic import write_text
    from zgdata.config import PartitionConfig, load_params, section
    from zgtrain.pipeline import dump_params, write_pipeline

    p = load_params(params)
    part = section(p, PartitionConfig)
    old = p.get("blocks") or {}
    p["blocks"] = {b.key: {**{k: v for k, v in old.get(b.key, {}).items() if k not in ("in", "out")},
                           "in": b.input, "out": b.output} for b in part.blocks()}
    write_text(params, dump_params(p))
    code_deps = (params.parent / "zgtrain" / "trainer.py").exists()
    path = write_pipeline(params.parent, p, code_deps=code_deps)
    stderr.print(f"wrote {path} with blocks {', '.join(p['blocks'])}")


@app.command("params")
def params_doc():
    """Explain every params.yaml key: its default (from the config dataclasses) and allowed values."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from zgdata.config import describe
    from zgtrain.config import SECTIONS

    table = Table("key", "default", "meaning", show_lines=False)
    table.add_row("seed", "0", "global seed; each block derives its own by a stable hash with its key. Allowed: an "
                               "integer >= 0.")
    for sec, cls in SECTIONS.items():
        for name, default, doc in describe(cls):
            table.add_row(f"{sec}.{name}", escape(default), escape(doc))
    table.add_row("blocks.KEY", "", "per-block in/out boundary names plus any train.* key to override for that block")
    Console().print(table)


@app.command("repro")
def repro(targets: Optional[list[str]] = typer.Argument(None, help="stages to bring up to date (default: all)."),
          jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="blocks trained at once (1: in this process, "
                                                                   "no Ray)."),
          address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster (default: start a "
                                                                         "local one sized by --jobs)."),
          data: str = typer.Option("shared", "--data", help="shared: workers see the project's file system; "
                                                             "remote: they clone it and use the DVC remote."),
          as_json: bool = typer.Option(False, "--json")):
    """Like `dvc repro`, with up to --jobs stale blocks trained at once (Ray); each is recorded in dvc.lock."""
    from zgtrain.repro import repro as run

    r = run(Path.cwd(), list(targets or []), jobs=jobs, address=address, data=data)
    restored = f"; restored from DVC's run cache: {', '.join(r['restored'])}" if r["restored"] else ""
    emit(r, as_json=as_json, summary=f"ran: {', '.join(r['ran']) or 'nothing'}{restored} in {r['seconds']:.0f} s")


@train_app.command("block")
def train_block(key: str = typer.Argument(..., help="block key, e.g. b00."),
                targets: Optional[str] = typer.Option(None, help="cached or online (default train.targets)."),
                stop_after: Optional[int] = typer.Option(None, "--stop-after",
                                                         help="run at most N (>= 1) more steps, checkpoint, exit 0; rerun to resume."),
                restart: bool = typer.Option(False, "--restart", help="discard a checkpoint whose config differs."),
                params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Train block KEY alone from its boundary pair (blocks.KEY over train: defaults). Resumes from its checkpoint."""
    from zgtrain.config import ProjectConfig
    from zgtrain.trainer import train_block as run

    from zgdata.config import check_int

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)
    r = run(ProjectConfig.load(params), key, targets=targets, stop_after=stop_after, restart=restart)
    loss = "n/a (no steps)" if r.get("train_loss") is None else f"{r['train_loss']:.4g}"
    emit(r, as_json=as_json, summary=f"{key}: {r['status']} at step {r['step']}/{r['steps']}, "
         f"train_loss {loss}, state {r.get('state_sha256', '')[:12]}")


@train_app.command("assemble")
def train_assemble(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Build models/student/: teacher embeddings + trained blocks + final norm + LM head (from_pretrained loads it)."""
    from zgtrain.assemble import assemble
    from zgtrain.config import ProjectConfig

    r = assemble(ProjectConfig.load(params))
    emit(r, as_json=as_json, summary=f"student: {r['params']:,} params ({r['param_ratio']:.2f} of teacher) -> {r['path']}")


@train_app.command("repair")
def train_repair(stop_after: Optional[int] = typer.Option(None, "--stop-after",
                                                          help="run at most N (>= 1) more steps, checkpoint, exit 0."),
                 restart: bool = typer.Option(False, "--restart", help="discard models/repair's checkpoint."),
                 params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Repair (repair.steps > 0): distil models/student on the teacher's logits (head slice on the last boundary),
    train split only. Writes models/repaired; resumes from models/repair's checkpoint."""
    from zgdata.config import check_int
    from zgtrain.config import ProjectConfig
    from zgtrain.repair import repair

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)
    r = repair(ProjectConfig.load(params), stop_after=stop_after, restart=restart)
    kl = f", train KL {r['kl_train_before']:.4g} -> {r['kl_train_after']:.4g}" if r["status"] == "done" else ""
    emit(r, as_json=as_json, summary=f"repair: {r['status']} at step {r['step']}/{r['steps']}{kl}, "
         f"state {r['state_sha256'][:12]}")


@train_app.command("evaluate")
def train_evaluate(params: Path = params_option, as_json: bool = typer.Option(False, "--json"),
                   strict: bool = typer.Option(False, "--strict", help="exit 1 when a gate fails (CI use).")):
    """Held-out CE, context use and boundary shift of teacher vs student; gates from `gates:`. Writes metrics/eval.json."""
    from zgtrain.config import ProjectConfig
    from zgtrain.evaluate import evaluate

    r = evaluate(ProjectConfig.load(params))
    verdict = "PASS" if r["gates_passed"]["all"] else "FAIL"
    emit(r, as_json=as_json, summary=f"gates {verdict}: teacher CE {r['teacher_ce']:.3f}, student CE "
         f"{r['student_ce']:.3f} (gap {r['ce_gap']:.3f}), context retention {r['context_retention']:.2f}")
    for name, g in r["gates_passed"].items():
        if name != "all" and not g["passed"]:
            op = "<=" if name.startswith("max") else ">="
            print(f"gate gates.{name} failed: measured {g['value']:.4g}, needs {op} {g['threshold']}", file=sys.stderr)
    if strict and not r["gates_passed"]["all"]:
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights never come from a hub here
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    debug = os.environ.get("ZG_DEBUG") == "1" or "--debug" in args
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        rc = typer.main.get_command(app).main(args=args, prog_name="zg", standalone_mode=False)
    except ZgError as e:
        if debug:
            raise
        print(f"error: {e.render()}", file=sys.stderr)
        sys.exit(e.code)
    except click_exc.ClickException as e:  # usage errors: unknown command, missing argument, bad option value
        cmd = e.ctx.command_path if getattr(e, "ctx", None) is not None else "zg"
        print(f"error: {e.format_message().rstrip('.')}. Run `{cmd} --help` for usage.", file=sys.stderr)
        sys.exit(e.exit_code or 2)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # full disk, quota, permissions, read-only file system: one line; anything else is a bug
        if debug or (err := from_os_error(e)) is None:
            raise
        print(f"error: {err.render()}", file=sys.stderr)
        sys.exit(err.code)
    sys.exit(rc if isinstance(rc, int) else 0)

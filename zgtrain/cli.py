"""The `zg` entry point: run the command tree (zgtrain.commands, typer) and turn its failures into one line.

Help is answered without typer: `zg`, `zg --help`, `zg GROUP` and `zg COMMAND... --help` print the page
zgtrain/cli_help.py holds, rendered from the command tree by `python -m zgtrain.docs_ref` (tests/test_cli_help.py
fails when it is stale). Importing typer and building the tree alone took longer than the interpreter's own start.
"""

from __future__ import annotations

import functools
import os
import sys

__all__ = ["app", "help_page", "main", "run", "subfolder_hint"]  # noqa: F822 - app comes from __getattr__ below


def __getattr__(name: str):
    if name == "app":  # the typer app, imported on first use: `from zgtrain.cli import app` still works
        from zgtrain.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns, which click's help formatter reads, without importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def help_page(args: list[str]) -> tuple[str, int] | None:
    """(page, exit code) when ``args`` only ask for a help page zgtrain/cli_help.py holds, as typer would print it:
    ``COMMAND... --help`` (exit 0) or a group without a command (exit 2, as its no_args_is_help gives). None
    otherwise (typer answers): anything else, or a terminal narrower than the 78 columns the pages are wrapped at."""
    from zgtrain.cli_help import GROUPS, PAGES, WIDTH

    asks = args[-1:] == ["--help"]
    path = " ".join(["zg", *(args[:-1] if asks else args)])
    if path not in PAGES or not (asks or path in GROUPS) or max(min(_terminal_columns(), 80) - 2, 50) != WIDTH:
        return None
    return PAGES[path], 0 if asks else 2


def _quiet_hf_progress() -> None:
    """No transformers / huggingface_hub progress bars, without importing transformers here (commands that
    never load a model start faster): both read HF_HUB_DISABLE_PROGRESS_BARS when they are first imported."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:  # already imported (a caller that runs `main` in its own process)
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def subfolder_hint() -> str:
    """When the working folder lies inside a project but is not its root, where to run from: every `zg` command
    reads params.yaml, dvc.yaml and the data from the folder it runs in (as the stages do), so an error there
    ("params.yaml not found", "data/tokens.lance does not exist") would otherwise send the user to `zg init` or
    `dvc repro`. Empty anywhere else."""
    from pathlib import Path

    from zgdata.core.paths_guard import MARKERS, project_root

    try:
        here = Path.cwd()
    except OSError:  # the working folder was deleted
        return ""
    if any((here / m).exists() for m in MARKERS) or (root := project_root(here)) is None:
        return ""
    from zgdata.errors import shell_arg

    return (
        f"(this folder is inside the project at {root}; zg's project commands run from its root: "
        f"`cd {shell_arg(root)}`)"
    )


@functools.cache
def _command():
    """The click command typer builds from the tree, once per process: building it inspects every command's
    signature, about 15 ms, which a process that calls ``main`` many times (the tests) would pay on every call.
    click makes a new context for each invocation, so the command itself keeps no state between calls."""
    import typer

    from zgtrain.commands import app

    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights never come from a hub here
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _quiet_hf_progress()
    if (page := help_page(args)) is not None:
        sys.stdout.write(page[0])
        sys.stdout.flush()
        sys.exit(page[1])

    import typer
    from typer._click import exceptions as click_exc  # typer raises its own copy of click's exceptions

    from zgdata.errors import ZgError, from_nondeterministic, from_os_error

    debug = os.environ.get("ZG_DEBUG") == "1" or "--debug" in args
    try:
        if os.environ.get("DVC_STAGE"):  # a stage command that DVC started: its graph must match params.yaml
            from pathlib import Path

            from zgtrain.pipeline.current import check

            check(Path.cwd(), experiment=os.environ.get("DVC_EXP_NAME"))  # set for the stages of `dvc exp run`
        rc = _command().main(args=args, prog_name="zg", standalone_mode=False)
    except ZgError as e:
        if debug:
            raise
        hint = subfolder_hint()
        print(f"error: {e.render()}{' ' + hint if hint else ''}", file=sys.stderr)
        sys.exit(e.code)
    except click_exc.NoArgsIsHelpError as e:  # a group without a command: its help (on a narrow terminal)
        print(e.format_message())
        sys.exit(2)
    except click_exc.ClickException as e:  # usage errors: unknown command, missing argument, bad option value
        cmd = e.ctx.command_path if getattr(e, "ctx", None) is not None else "zg"
        print(f"error: {e.format_message().rstrip('.')}. Run `{cmd} --help` for usage.", file=sys.stderr)
        sys.exit(e.exit_code or 2)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # full disk, quota, permissions, read-only file system: one line; anything else is a bug
        if debug or (err := from_os_error(e) or from_nondeterministic(e)) is None:
            raise
        print(f"error: {err.render()}", file=sys.stderr)
        sys.exit(err.code)
    sys.exit(rc if isinstance(rc, int) else 0)


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)


# The cyclic collector's first threshold in a `zg` process (Python's default: 700 allocations). Imports are most of a
# stage process's CPU (bench/cli_latency.py, part 2). Importing transformers' Llama code, lance and zg's teacher
# module (~420,000 objects) at the default ran the collector 1,085 times, 7 of them over the whole heap: 0.85 of the
# process's 7.6 CPU-s on a slow 2-core host (AMD EPYC family 23, 2026-12-06, gc.callbacks). At 10,000: 74 times, none
# over the whole heap, 0.30 CPU-s (part 3 of the bench measures the whole process). A reference cycle is still
# reclaimed within 10,000 allocations.
GC_FIRST_THRESHOLD = 10_000


def run() -> None:
    """The `zg` script (pyproject.toml): ``main`` on ``sys.argv`` with the collector's first threshold at
    ``GC_FIRST_THRESHOLD``, then an exit that does not walk the heap.

    A process that imported torch and transformers holds about 390,000 objects that the cyclic garbage collector
    tracks, and the interpreter's shutdown collects several times while it tears the modules down, a cost every
    `zg` process paid at its end. ``gc.freeze()`` moves them out of the collector's sight first (what that saves:
    bench/cli_latency.py, part 3, and bench/out/cli_latency.txt). Only the shutdown changes: every file zg writes is closed (and renamed into place) before ``main``
    returns, atexit handlers (Ray's disconnect, logging's flush) still run, and so does the flush of stdout and
    stderr; objects kept alive by a reference cycle are not finalized, which Python never promised at exit
    anyway. Not in ``main``: a process that calls ``main`` itself (the tests) goes on running and collecting."""
    import gc
    import signal

    gc.set_threshold(GC_FIRST_THRESHOLD, *gc.get_threshold()[1:])
    # SIGTERM (a scheduler's stop, `kill PID`) unwinds like Ctrl-C, so `finally` blocks run: a `zg repro` ends the
    # `dvc` it started and releases its locks instead of leaving them to an orphan
    signal.signal(signal.SIGTERM, _terminated)
    try:
        main()
    finally:
        gc.freeze()

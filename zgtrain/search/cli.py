"""`zg search`: the variant library and the budgeted search over it. Each command parses its arguments, loads the
project's config, calls one function of zgtrain.search and renders its typed result (zgtrain.commands adds this
group to the `zg` tree)."""

from __future__ import annotations

from pathlib import Path

import typer

from zgdata.cli import GROUP, emit, params_option

__all__ = ["search_app"]

search_app = typer.Typer(
    help="The variant library and the budgeted search over it (params variants:, search:).", **GROUP
)


@search_app.command("run")
def search_run(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Pick one variant (or the teacher block) per block within search.budget; writes search/choice.json."""
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.solve import run_search

    r = run_search(ProjectConfig.load(params))
    mix = ", ".join(f"{b}={o['variant']}" for b, o in r.blocks.items())
    budget = f"budget {r.budget_cost:,.0f} ({r.cost})"
    if r.measured or len(r.constraints) > 1:  # the bounds as the search met them (latency: embedding + head included)
        budget = "; ".join(
            f"{c} {('{:.4g}' if c == 'latency' else '{:,.0f}').format(v['value'])} <= "
            f"{('{:.4g}' if c == 'latency' else '{:,.0f}').format(v['bound'])}"
            for c, v in r.constraints.items()
        )
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"mix {mix}: {r.params:,} params ({r.param_ratio:.3f} of the "
        f"teacher's blocks), {r.kv_bytes:,.0f} KV bytes/token ({r.kv_ratio:.3f}); {budget}; "
        f"predicted CE delta {r.predicted_ce_delta:+.4f}; pool of {len(r.pool)}",
    )


@search_app.command("assemble")
def search_assemble(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Build the searched student and judge it: the best mix of search/choice.json is assembled (each block's chosen
    variant or the teacher block) and evaluated on every eval set; if it fails a gate, the next-best mixes within
    the budget are tried, up to search.max_tries. The first that passes (else the closest miss) is written to
    models/search/student/; every try's figures go to metrics/search_eval.json."""
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.assemble import assemble_choice

    r = assemble_choice(ProjectConfig.load(params))
    verdict = (
        f"passes the gates (try {r.written_try + 1} of {len(r.tries)})"
        if r.passed
        else f"NO mix passes the gates in {len(r.tries)} tries: {r.unmet['message']}"
    )
    m = r.measured
    timed = (
        f"; {m['phase']} measured {m[m['phase']]['measured']['median']:.3f} against {m[m['phase']]['predicted']:.3f} "
        f"predicted ({m['error']:+.1%}; {m['relative_error']:+.1%} relative to the teacher timed alongside)"
        if m
        else ""
    )
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"searched student: {r.student.params:,} params "
        f"({r.student.param_ratio:.2f} of teacher), {verdict}{timed} -> {r.path}",
    )


@search_app.command("repair")
def search_repair(
    stop_after: int | None = typer.Option(
        None, "--stop-after", help="run at most N (>= 1) more steps, checkpoint, exit 0."
    ),
    restart: bool = typer.Option(False, "--restart", help="discard models/search/repair's checkpoint."),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Repair the searched student (repair.steps > 0, the repair: settings): distil models/search/student on the
    teacher's logits into models/search/repaired, then judge it on every eval set against the gates. Writes
    metrics/search_repair.json (before and after); resumes from models/search/repair's checkpoint."""
    from zgdata.config import check_int
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.repair import repair_search

    stop_after = None if stop_after is None else check_int("--stop-after", stop_after, ge=1)
    r = repair_search(ProjectConfig.load(params), stop_after=stop_after, restart=restart)
    if r.status != "done":
        emit(r.metrics(), as_json=as_json, summary=f"search repair: {r.status} at step {r.step}/{r.steps}")
        return
    first = next(iter(r.sets))
    emit(
        r.metrics(),
        as_json=as_json,
        summary=f"repaired searched student (try {r.tried}): {first} CE gap "
        f"{r.before['sets'][first]['ce_gap']:.4f} -> {r.sets[first]['ce_gap']:.4f}, "
        + ("passes the gates" if r.passed else f"FAILS the gates: {r.unmet}"),
    )


@search_app.command("show")
def search_show(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """List each (block, variant): trained and scored or not, stale or not (`dvc status`), its scores."""
    from zgdata.core.progress import stderr
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.variants import show

    r = show(ProjectConfig.load(params), stale=(params.parent / "dvc.yaml").exists())
    if as_json:
        emit(r, as_json=True, summary="")
        return
    for v in r["variants"]:
        ce = "-" if v["ce_delta"] is None else f"{v['ce_delta']:+.4f}"
        n = "-" if v["params"] is None else f"{v['params']:,}"
        print(
            f"{v['block']}\t{v['variant']}\t{'exists' if v['exists'] else 'missing'}\t"
            f"{'stale' if v['stale'] else 'up to date'}\tparams {n}\tce_delta {ce}"
        )
    stderr.print(f"{r['exist']}/{r['total']} variants trained, {r['stale']} stale")


@search_app.command("costs")
def search_costs(
    measure: bool = typer.Option(
        False, "--measure", help="time every option now and write search/cost/table.json (the search_cost stage)."
    ),
    params: Path = params_option,
    as_json: bool = typer.Option(False, "--json"),
):
    """Show the measured cost table (search/cost/table.json): each block option's latency at search.workload (median
    and spread over the repeats, of search.workload.phase) and KV-cache bytes, the embedding + head's base, and how
    far each uniform model's measured total is from its predicted sum. --measure times them first."""
    from rich.console import Console
    from rich.table import Table

    from zgdata.layout import Layout
    from zgtrain.project.config import ProjectConfig
    from zgtrain.search.cost import read_table, table_rows
    from zgtrain.search.table import measure_table

    project = ProjectConfig.load(params)
    table = measure_table(project) if measure else read_table(project, Layout())
    if as_json:
        emit(table, as_json=True, summary="")
        return
    phase = f"{project.search.served.phase}_ms"
    out = Table("block", "option", phase, "spread", "KV-cache bytes", title=table["machine"]["kind"])
    for r in table_rows(table, phase):
        ms, spread = ("-", r["why"]) if r["ms"] is None else (f"{r['ms']:.4f}", f"{r['spread']:.0%}")
        out.add_row(r["block"], r["option"], ms, spread, f"{r['kv_cache']:,.0f}")
    Console().print(out)
    for option, m in table["models"].items():
        if m["measured"] is None:
            continue
        print(
            f"{option} everywhere: measured {m['measured'][phase]['median']:.3f} ms, predicted "
            f"{m['predicted'][phase]:.3f} ms ({m['additivity'][phase]:+.1%})"
        )

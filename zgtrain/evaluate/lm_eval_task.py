"""zg's own lm-evaluation-harness task, built from the project's held-out split: no download needed.

``zg_nextline`` is multiple choice: given a few lines of held-out text, pick the true next line
among distractor lines from other held-out documents (or, when there are too few, from other
held-out rows of the same document, then from far parts of the same row). Each held-out row of
``data/tokens.lance`` is decoded with the teacher's (identity-checked) tokenizer and cut at
EOS/pad tokens into segments; the line to choose is a whole line, its context the lines before
it (the first may start mid-line). The sample, distractors and answer positions come from one
seeded generator, so the same token set and ``lm_eval`` params give the same bytes.

Files (``eval/lm_eval/``): ``zg_nextline.jsonl`` (one example a line), ``zg_nextline.yaml`` (the
task for lm-eval: ``dataset_path: json``; usable as ``lm_eval --include_path eval/lm_eval`` from
the project root) and ``zg_nextline.json`` (lineage: tokens fingerprint, jsonl sha256, params).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from zgdata.core.atomic import write_json, write_text
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = [
    "NEXTLINE",
    "GENERATOR_VERSION",
    "task_dir",
    "task_files",
    "task_config",
    "segments",
    "build_examples",
    "write_nextline_task",
]

NEXTLINE = "zg_nextline"
GENERATOR_VERSION = 1  # bump when the examples a token set yields change
MIN_CHARS, MAX_CHARS = 8, 200  # a line to choose: not a stub, not a whole paragraph


def task_dir(layout: Layout) -> Path:
    return layout.lm_eval_dir


def task_files(layout: Layout) -> dict[str, Path]:
    d = task_dir(layout)
    return {ext: d / f"{NEXTLINE}.{ext}" for ext in ("jsonl", "yaml", "json")}


def task_config(data_file: str, cache_dir: str, meta: dict) -> dict:
    """The lm-eval task config (the YAML's content). Paths as given: relative in the file, absolute for a run."""
    return {
        "task": NEXTLINE,
        "dataset_path": "json",
        # cache_dir: datasets' Arrow copy of the JSONL stays in the project's gitignored .zg/, not in ~/.cache
        "dataset_kwargs": {"data_files": {"test": data_file}, "cache_dir": cache_dir},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": "",  # the context ends with its newline; a choice is the next line itself
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {
            "version": float(GENERATOR_VERSION),
            "tokens_fingerprint": meta["tokens_fingerprint"],
            "jsonl_sha256": meta["jsonl_sha256"],
        },
    }


def segments(layout: Layout) -> tuple[list[tuple[str, list[str]]], dict]:
    """The held-out text as segments ``(document, lines)``: one per held-out row, cut again at EOS/pad.

    Rows are windows of the corpus; a capped split keeps a sample of them, so two rows are never assumed to
    continue each other. A segment's first line may start mid-line (context only) and its last line may stop
    mid-line, so the last is dropped."""
    from zgdata.lineage import read_tokens_json
    from zgdata.teacher.prepare import load_tokenizer
    from zgdata.tokens.store import open_tokens

    ds = open_tokens(layout)
    cols = ["seq_id", "split", "doc", "input_ids"] + (["length"] if "length" in ds.schema.names else [])
    table = ds.to_table(columns=cols)
    rows = np.flatnonzero(np.asarray(table.column("split").to_pylist()) == "heldout")
    if not len(rows):
        raise ZgError(
            f"{layout.tokens} has no held-out rows",
            key="corpus.heldout",
            fix="hold out some documents (corpus.heldout, heldout_field or heldout_fraction), then `dvc repro tokens`",
        )
    rows = rows[np.argsort(np.asarray(table.column("seq_id").to_pylist())[rows], kind="stable")]
    ids = table.column("input_ids").combine_chunks().values.to_numpy().astype(np.int64).reshape(len(table), -1)
    length = table.column("length").to_pylist() if "length" in cols else None
    docs = table.column("doc").to_pylist()
    tok = load_tokenizer(layout)
    cut = {t for t in (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) if t is not None}
    segs = []
    for r in rows:
        row = ids[r][: length[r]] if length is not None else ids[r]
        ends = [i for i, t in enumerate(row.tolist()) if t in cut]
        for n, (a, b) in enumerate(zip([0] + [e + 1 for e in ends], ends + [len(row)])):
            lines = tok.decode(row[a:b].tolist()).split("\n")[:-1] if b > a else []
            if len(lines) >= 2:  # a (maybe partial) first line and at least one whole line
                segs.append((f"{docs[r]}" if n == 0 else f"{docs[r]}+{n}", lines))  # after an EOS: the next document
    return segs, {"tokens_fingerprint": read_tokens_json(layout)["fingerprint"], "heldout_rows": int(len(rows))}


def _choosable(line: str) -> bool:
    return MIN_CHARS <= len(line.strip()) <= MAX_CHARS


def build_examples(
    segs: list[tuple[str, list[str]]], *, examples: int, choices: int, context_lines: int, seed: int
) -> tuple[list[dict], dict]:
    """Seeded multiple-choice examples: the true next line among ``choices - 1`` distractors.

    Distractors come from other documents when there are enough distinct lines there, else also from other
    segments of the same document, else also from lines of the same segment far from the context."""
    cands = []  # (segment, line, first context line): whole lines with at least one non-blank line before
    for s, (_, lines) in enumerate(segs):
        nonblank = [j for j, line in enumerate(lines) if line.strip()]
        for k, j in enumerate(nonblank):
            if k >= 1 and _choosable(lines[j]):
                cands.append((s, j, nonblank[max(0, k - context_lines)]))
    if not cands:
        raise ZgError(
            "the held-out split yields no next-line example (no line of 8-200 characters after another line)",
            key="corpus.heldout",
            fix="hold out more text, or text with line breaks",
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(cands))[:examples]  # lm-eval's limit takes the first N: keep them a random sample
    out, tiers = [], {"other_documents": 0, "other_segments": 0, "same_segment": 0}
    for n, c in enumerate(order):
        s, j, a = cands[c]
        doc, lines = segs[s]
        truth = lines[j]
        seen, tier = {truth.strip()}, ([], [], [])
        for ps, pj, _ in cands:  # every candidate line is a possible distractor; each distinct text once
            text = segs[ps][1][pj]
            if text.strip() in seen:
                continue
            if segs[ps][0] != doc:
                tier[0].append(text)
            elif ps != s:
                tier[1].append(text)
            elif abs(pj - j) > context_lines + 1:  # same segment, but far from this context
                tier[2].append(text)
            else:
                continue
            seen.add(text.strip())
        picks, used = [], 0
        while len(picks) < choices - 1 and used < 3:
            picks += tier[used]
            used += 1
        if len(picks) < choices - 1:
            raise ZgError(
                f"the held-out split has too few distinct lines for {choices} choices per example "
                f"({len(picks) + 1} usable)",
                key="lm_eval.choices",
                fix="lower lm_eval.choices, or hold out more text",
            )
        tiers[list(tiers)[used - 1]] += 1
        wrong = [picks[i] for i in sorted(rng.choice(len(picks), choices - 1, replace=False))]
        label = int(rng.integers(choices))
        opts = wrong[:label] + [truth] + wrong[label:]
        out.append(
            {
                "id": f"{NEXTLINE}-{n:05d}",
                "context": "\n".join(lines[a:j]) + "\n",
                "choices": [o + "\n" for o in opts],
                "label": label,
                "doc": doc,
                "segment": s,
                "line": j,
            }
        )
    return out, {"candidates": len(cands), "distractors_from": tiers}


def write_nextline_task(cfg, layout: Layout = Layout()) -> dict:
    """Write eval/lm_eval/zg_nextline.{jsonl,yaml,json} from the held-out split; return the lineage record."""
    import yaml

    segs, src = segments(layout)
    ex, stats = build_examples(
        segs, examples=cfg.examples, choices=cfg.choices, context_lines=cfg.context_lines, seed=cfg.seed
    )
    body = "".join(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n" for e in ex)
    meta = {
        "task": NEXTLINE,
        "generator_version": GENERATOR_VERSION,
        **src,
        "segments": len(segs),
        **stats,
        "examples": len(ex),
        "choices": cfg.choices,
        "context_lines": cfg.context_lines,
        "seed": cfg.seed,
        "jsonl_sha256": hashlib.sha256(body.encode()).hexdigest(),
    }
    files = task_files(layout)
    rel = files["jsonl"].relative_to(layout.root).as_posix()
    head = (
        f"# Generated by `zg train lm-eval` from the held-out split of data/tokens.lance (tokens fingerprint "
        f"{meta['tokens_fingerprint'][:16]}...).\n# Run from the project root: "
        f"lm_eval --include_path eval/lm_eval --tasks {NEXTLINE} ...\n"
    )
    write_text(files["jsonl"], body)
    cache = Layout(Path("")).hf_datasets_cache.as_posix()  # relative to the project root, like rel
    write_text(files["yaml"], head + yaml.safe_dump(task_config(rel, cache, meta), sort_keys=False))
    write_json(files["json"], meta)
    return meta

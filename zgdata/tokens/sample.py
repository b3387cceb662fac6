"""The sample stage: a corpus of text sampled from the teacher itself (``corpus.source: teacher:sample``).

A user with the model but not its pretraining data still has the model: its samples cover its own distribution,
which is what a conversion must keep (the data-free distillation recipe of LLM-QAT). ``zg data sample`` writes
data/sample.jsonl, one ``{"id", "text"}`` object per kept document, which the tokens stage reads as it reads any
JSONL corpus, and data/sample.json, its lineage: the teacher's weights and tokenizer digests, every sampling
param, the prompts' digest, and what was dropped.

**How.** ``corpus.sample.documents`` documents in batches of ``batch_size`` through transformers' ``generate``
(the teacher's KV cache, prompts left-padded), with temperature and top-p and no top-k (transformers' warpers;
top-p's sort by zgdata/tokens/nucleus.py, bit for bit). Document ``i`` starts
from prompt ``i mod P`` (BOS alone; the strings given; or, in a mix, the first ``prompt_tokens`` tokens of the
other sources' train documents: never a held-out one). It ends at EOS or after ``tokens`` new tokens.

**Bits.** Batch ``b`` holds documents ``b*B ... b*B+B-1`` and samples from torch's generator seeded with a hash of
(``seed``, ``b``), so a batch's output depends on nothing but the params, the teacher and the machine kind and
threads (``threads``; on CPU a batch's rows are computed together, so the batch is fixed too). Each finished
batch is kept in data/.sample.parts/ under the run's fingerprint; a killed run resumes at the first missing
batch and ends in the same bytes. A change of any param starts over.

**Degenerate samples** (measured, recorded, dropped): ``empty`` (no text but whitespace), ``short`` (fewer than
``min_tokens`` new tokens: the model stopped at once), ``repetitive`` (fewer distinct token 4-grams than
``min_distinct`` of its 4-grams: a loop). The rule reads the new tokens only, not the prompt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from zgdata.config import SAMPLE_SOURCE, CorpusConfig, SampleConfig
from zgdata.core import failpoints
from zgdata.core.atomic import write_json, write_text
from zgdata.core.hashing import fingerprint, sha256_bytes
from zgdata.core.lock import locked
from zgdata.core.paths_guard import output
from zgdata.core.progress import progress as _progress
from zgdata.core.runtime import set_threads
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = ["sample_corpus", "SampleResult", "degenerate", "batch_seed", "SAMPLE_VERSION", "DROP_REASONS"]

SAMPLE_VERSION = 1
DROP_REASONS = ("empty", "short", "repetitive")
PROMPT_CHARS = 4096  # characters of a real document read for its first prompt_tokens tokens


@dataclass(frozen=True)
class SampleResult:
    path: Path
    fingerprint: str
    requested: int
    kept: int
    dropped: dict
    tokens: int  # new tokens in the kept documents


def degenerate(new_ids: list[int], text: str, scfg: SampleConfig) -> str | None:
    """Why a sampled document is dropped (one of DROP_REASONS), or None to keep it."""
    if not text.strip():
        return "empty"
    if len(new_ids) < scfg.min_tokens:
        return "short"
    grams = [tuple(new_ids[i : i + 4]) for i in range(len(new_ids) - 3)]
    if grams and len(set(grams)) < scfg.min_distinct * len(grams):
        return "repetitive"
    return None


def batch_seed(seed: int, batch: int) -> int:
    """The torch seed of batch ``batch``: independent of every other batch, so a resumed run needs no RNG state."""
    return int.from_bytes(hashlib.sha256(f"zg-sample:{seed}:{batch}".encode()).digest()[:8], "big") >> 1


def _prompts(cfg: CorpusConfig, scfg: SampleConfig, tok) -> tuple[list[list[int]], str]:
    """(prompt ids, each starting with BOS (EOS without one), and what they are)."""
    start = [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]
    if scfg.prompts == "bos":
        return [start], "bos"
    if isinstance(scfg.prompts, list):
        return [start + tok(s, add_special_tokens=False)["input_ids"] for s in scfg.prompts], "list"
    from zgdata.tokens.tokenset import train_documents

    out = []
    for part in cfg.parts():
        if part.source == SAMPLE_SOURCE:
            continue
        for d in train_documents(part):
            head = next(iter(d.chunks()), "")[:PROMPT_CHARS]
            ids = tok(head, add_special_tokens=False)["input_ids"][: scfg.prompt_tokens]
            if ids:
                out.append(start + ids)
    if not out:
        raise ZgError(
            "corpus.sample.prompts is corpus, but the mix's other sources have no train document",
            key="corpus.sample.prompts",
            fix="use prompts: bos, or add a real corpus to the mix",
        )
    return out, "corpus"


def _generate(model, prompts: list[list[int]], scfg: SampleConfig, seed: int, eos: int, pad: int) -> list[list[int]]:
    """New token ids per prompt (left-padded into one batch), cut before the first EOS."""
    from transformers import GenerationConfig, LogitsProcessorList
    from transformers.generation.logits_process import TemperatureLogitsWarper

    from zgdata.tokens.nucleus import NucleusFilter

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    # transformers' temperature then top-p warpers, in that order: generate puts a custom processor before the
    # warpers it builds, so both come from here (zgdata/tokens/nucleus.py: top-p's bits in about a quarter of the time)
    warpers = [TemperatureLogitsWarper(scfg.temperature)] if scfg.temperature != 1.0 else []
    if scfg.top_p < 1.0:
        warpers.append(NucleusFilter(scfg.top_p))
    gen = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=scfg.tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    dev = next(model.parameters()).device
    model.generation_config = GenerationConfig()  # a checkpoint's own defaults (top_k, penalties) never mix in
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            generation_config=gen,
            logits_processor=LogitsProcessorList(warpers),
        )
    rows = out[:, width:].tolist()
    return [r[: r.index(eos)] if eos in r else r for r in rows]


def _records(first: int, prompts, new, tok, scfg: SampleConfig) -> list[dict]:
    out = []
    for i, (p, n) in enumerate(zip(prompts, new, strict=True)):
        text = tok.decode(p[1:] + n, skip_special_tokens=True)
        out.append({"id": f"s{first + i:07d}", "text": text, "tokens": len(n), "drop": degenerate(n, text, scfg)})
    return out


def _open_parts(layout: Layout, fp: str) -> Path:
    """data/.sample.parts for the run ``fp``: kept when a killed run of the same fingerprint left it, else new."""
    parts = output(layout.sample_parts, layout.root, what="sample parts folder")
    spec = parts / "spec.json"
    try:
        same = json.loads(spec.read_text())["fingerprint"] == fp
    except (OSError, ValueError, KeyError, TypeError):
        same = False
    if not same:
        if parts.is_symlink():
            parts.unlink()
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        write_json(spec, {"fingerprint": fp})
    return parts


@locked("sample")
def sample_corpus(cfg: CorpusConfig, *, layout: Layout = Layout(), progress=None) -> SampleResult:
    """Sample data/sample.jsonl and data/sample.json from the prepared teacher (module docstring)."""
    from zgdata.teacher.prepare import load_teacher, read_teacher_json

    scfg = cfg.sample_config()
    teacher = read_teacher_json(layout)
    set_threads(scfg.threads)
    model, tok = load_teacher(layout, dtype=scfg.dtype)
    eos = tok.eos_token_id
    if eos is None:
        raise ZgError("the teacher's tokenizer has no EOS token, which ends a sample", fix="use another teacher")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    prompts, kind = _prompts(cfg, scfg, tok)
    prompts_sha = sha256_bytes(json.dumps(prompts).encode())
    inputs = {
        "teacher_sha256": teacher["weights_sha256"],
        "tokenizer_sha256": teacher["tokenizer_sha256"],
        "params": asdict(scfg),
        "prompts_sha256": prompts_sha,
    }
    fp = fingerprint("sample", SAMPLE_VERSION, inputs)
    parts = _open_parts(layout, fp)
    size = scfg.batch_size
    batches = -(-scfg.documents // size)
    done = [b for b in range(batches) if (parts / f"{b:06d}.jsonl").exists()]
    with (progress or _progress)("sample", scfg.documents, unit="doc", completed=len(done) * size) as advance:
        for b in range(batches):
            if b in done:
                continue
            idx = range(b * size, min((b + 1) * size, scfg.documents))
            batch = [prompts[i % len(prompts)] for i in idx]
            new = _generate(model, batch, scfg, batch_seed(scfg.seed, b), eos, pad)
            recs = _records(idx[0], batch, new, tok, scfg)
            write_text(parts / f"{b:06d}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            advance(len(idx))
            failpoints.pause(failpoints.AFTER_SAMPLE_BATCH)
    return _publish(layout, parts, batches, fp, inputs, kind, len(prompts), scfg)


def _publish(layout: Layout, parts: Path, batches: int, fp: str, inputs: dict, kind: str, n_prompts: int, scfg):
    """The finished batches into data/sample.jsonl (kept documents, in order) and data/sample.json."""
    import transformers

    lines, dropped, tokens, generated = [], Counter(), 0, 0
    for b in range(batches):
        for line in (parts / f"{b:06d}.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            generated += r["tokens"]
            if r["drop"]:
                dropped[r["drop"]] += 1
                continue
            tokens += r["tokens"]
            lines.append(json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n")
    if not lines:
        raise ZgError(
            f"all {scfg.documents} sampled documents were dropped as degenerate ({dict(dropped)})",
            key="corpus.sample",
            fix="lower corpus.sample.min_tokens / min_distinct, or raise temperature or tokens",
        )
    body = "".join(lines)
    layout.sample_json.unlink(missing_ok=True)  # until both are written, the pair is absent, never mismatched
    write_text(layout.sample_jsonl, body)
    lineage = {
        **{k: v for k, v in inputs.items() if k != "params"},
        "sample_version": SAMPLE_VERSION,
        "params": inputs["params"],
        "prompts": {"kind": kind, "count": n_prompts},
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
    }
    drops = {r: dropped.get(r, 0) for r in DROP_REASONS}
    write_json(
        layout.sample_json,
        {
            "fingerprint": fp,
            "documents": {"requested": scfg.documents, "kept": len(lines), "dropped": drops},
            "tokens": {"generated": generated, "kept": tokens},
            "jsonl_sha256": sha256_bytes(body.encode()),
            "lineage": lineage,
        },
    )
    shutil.rmtree(parts, ignore_errors=True)
    return SampleResult(layout.sample_jsonl, fp, scfg.documents, len(lines), drops, tokens)

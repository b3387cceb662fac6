"""Timing on the llama.cpp runtime (llama-cpp-python): a model exported to GGUF by zgtrain/export/gguf.py, one
request of the workload (the prompt evaluated with the cache, then one single-token step per generated token).

llama.cpp runs a model as one graph: it has no per-layer hooks. A block's cost is therefore attributed from whole
models: the teacher model and the teacher truncated after its first block give, by their difference, the time of
one teacher layer and so the base (embedding, final norm, head: the total minus every layer); each uniform model
(one option in every block) then spreads its time past the base over its blocks by their layer counts (a uniform
model's layers have one shape each, a conversion applied alike to every block). Options llama.cpp cannot express
(zgtrain/export/gguf.py refuses them: say, MLP-free layers or per-layer KV heads where the architecture reads one
count) are recorded as such, with export's reason, and never chosen. The workload's batch must be 1 (one sequence:
llama-cpp-python's high-level API).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zgdata.errors import ZgError

__all__ = ["export_for_timing", "llama_runs", "llama_timer", "split_uniform", "DTYPE"]

DTYPE = "f16"  # the GGUF weights timed: what `zg export --format gguf` writes by default


def export_for_timing(model, summary: dict, folder: Path, tokenizer, teacher_sha256: str) -> Path | str:
    """``model`` written as a student folder in ``folder`` and exported to ``folder``/model.gguf; the GGUF's path,
    or export's one-line reason when llama.cpp cannot express it."""
    from zgtrain.export.gguf import check_gguf, export_gguf
    from zgtrain.student.assemble import write_student_files
    from zgtrain.student.load import record_checksums

    student = folder / "student"
    write_student_files(student, model, summary, tokenizer, teacher_sha256=teacher_sha256)
    record_checksums(student)
    try:
        check_gguf(student, dtype=DTYPE)  # what llama.cpp cannot express is refused here, before any writing
    except ZgError as e:
        return e.what
    out = folder / "model.gguf"
    export_gguf(student, out, dtype=DTYPE)
    return out


@contextmanager
def llama_timer(path: Path, *, vocab: int, prompt: int, generate: int, threads: int) -> Iterator:
    """The GGUF at ``path`` loaded once in llama.cpp; yields ``run(warmup, repeats)``: that many timed requests
    (after ``warmup`` untimed ones), each the seconds of the prompt's evaluation and of all decode steps together
    (the same fields as zgtrain/search/measure.py's, without per-layer times)."""
    import llama_cpp
    import torch

    ids = torch.randint(0, vocab, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=prompt + generate,
        n_batch=max(prompt, 1),
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )

    def one() -> dict:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for g in range(generate):  # which token is fed does not change the step's work
            llm.eval([ids[g % prompt]])
        return {"prefill_total": prefill, "decode_total": time.perf_counter() - t}

    def run(warmup: int, repeats: int) -> list[dict]:
        for _ in range(warmup):
            one()
        return [one() for _ in range(repeats)]

    try:
        yield run
    finally:
        llm.close()


def llama_runs(
    path: Path, *, vocab: int, prompt: int, generate: int, warmup: int, repeats: int, threads: int
) -> list[dict]:
    """``repeats`` timed requests (after ``warmup``) of the GGUF at ``path`` (``llama_timer``)."""
    with llama_timer(path, vocab=vocab, prompt=prompt, generate=generate, threads=threads) as run:
        return run(warmup, repeats)


def split_uniform(full: list[dict], first: list[dict], layers: int, first_layers: int) -> list[dict]:
    """Per run of the teacher (``layers`` layers), the base's seconds (prefill, decode): the run's total less its
    layers, one layer costing (median full - median first) / (layers - first_layers), ``first`` the runs of the
    teacher cut after its first block (``first_layers``). Medians, not run pairs: a cold first run (llama.cpp's
    first graph) must not move the per-layer figure."""
    import statistics

    if layers <= first_layers:
        raise ValueError("the truncated teacher must have fewer layers")
    keys = ("prefill_total", "decode_total")
    med = {k: (statistics.median(r[k] for r in full), statistics.median(r[k] for r in first)) for k in keys}
    per = {k: (f - c) / (layers - first_layers) for k, (f, c) in med.items()}
    return [{k: r[k] - layers * per[k] for k in keys} for r in full]

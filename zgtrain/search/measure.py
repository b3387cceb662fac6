"""Timing a causal LM at a serving workload on the torch runtime: prefill, then one decode step per generated token.

Each decoder layer is timed by a forward pre-hook and a forward hook (perf_counter; on CPU torch runs in program
order, so a layer's interval is its own compute). What the layers do not account for (the embedding, the final
norm, the LM head and the Python between layers) is the run's total minus their sum: the "base" that
zgtrain/search/cost.py adds once to every mix. Prompts are seeded random token ids: a layer's time does not
depend on which tokens it sees. Untimed warm-up runs come first; every timed run is kept, so the table can state
the spread across repeats (noise from a shared machine included) next to the median.
"""

from __future__ import annotations

import time

import torch

from zgdata.families.base import cache_arg

__all__ = ["timed_runs"]


def _hooks(layers, clock: dict):
    """Forward hooks adding each layer's wall time to ``clock['acc'][i]``; returns the handles."""
    handles = []
    for i, layer in enumerate(layers):

        def pre(_m, _a, i=i):
            clock["t0"][i] = time.perf_counter()

        def post(_m, _a, _o, i=i):
            clock["acc"][i] += time.perf_counter() - clock["t0"][i]

        handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]
    return handles


def _one_run(model, ids, generate: int, clock: dict, n: int) -> dict:
    """One request: the prompt's forward with a cache, then ``generate`` single-token steps. Seconds."""
    clock["acc"] = [0.0] * n
    t = time.perf_counter()
    out = model(input_ids=ids, use_cache=True)
    prefill_total = time.perf_counter() - t
    prefill = list(clock["acc"])
    clock["acc"] = [0.0] * n
    name = cache_arg()  # the installed transformers' name, so no deprecated alias warns inside the timed loop
    past, nxt = getattr(out, name), out.logits[:, -1:].argmax(-1)
    t = time.perf_counter()
    for _ in range(generate):
        out = model(input_ids=nxt, **{name: past}, use_cache=True)
        past, nxt = getattr(out, name), out.logits[:, -1:].argmax(-1)
    decode_total = time.perf_counter() - t
    return {
        "prefill": prefill,
        "decode": list(clock["acc"]),
        "prefill_total": prefill_total,
        "decode_total": decode_total,
    }


def timed_runs(model, layers, *, batch: int, prompt: int, generate: int, warmup: int, repeats: int, threads: int):
    """``repeats`` timed requests (after ``warmup`` untimed ones) of ``model`` whose decoder layers are ``layers``:
    per run, each layer's prefill and summed decode seconds and the two phases' totals."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
    clock = {"t0": [0.0] * len(layers), "acc": []}
    before = torch.get_num_threads()
    handles = _hooks(layers, clock)
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                _one_run(model, ids, generate, clock, len(layers))
            return [_one_run(model, ids, generate, clock, len(layers)) for _ in range(repeats)]
    finally:
        for h in handles:
            h.remove()
        torch.set_num_threads(before)

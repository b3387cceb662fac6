"""``search.workload``: the serving workload a measured search cost is timed at (zgtrain/search/cost.py).

A mapping inside ``search:`` (its keys are ``search.workload.KEY``); parsed from ``search.workload`` by
SearchConfig. The cost stage (``search_cost``) depends on this mapping and the variant library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from zgdata.config import Section, param

__all__ = ["WorkloadConfig", "RUNTIMES", "TABLE_COSTS"]

RUNTIMES = ("torch", "llama.cpp")
# search costs that come from the measured cost table (search/cost/table.json), not from the variant metrics
TABLE_COSTS = ("latency", "kv_cache")


@dataclass(kw_only=True, frozen=True)
class WorkloadConfig(Section):
    SECTION: ClassVar[str] = "search.workload"
    runtime: str = param(
        "torch",
        "Where the cost table times each variant: torch (zg's modeling code on CPU, each layer timed) or llama.cpp "
        "(llama-cpp-python on an f16 GGUF of each uniform model, timed whole and split by layer counts; batch 1; "
        "variants `zg export --format gguf` refuses are never chosen).",
        choices=RUNTIMES,
    )
    batch: int = param(1, "Sequences served at once.", ge=1, le=256)
    prompt: int = param(64, "Prompt tokens per sequence (the prefill).", ge=1)
    generate: int = param(16, "Tokens generated per sequence after the prompt (the decode steps).", ge=1)
    threads: int = param(1, "CPU threads the runtime uses while timing.", ge=1, le=1024)
    phase: str = param(
        "request",
        "What search.cost: latency sums: request (prefill + every decode step: one request's milliseconds), "
        "prefill (the prompt's milliseconds) or decode (milliseconds per generated token).",
        choices=("request", "prefill", "decode"),
    )
    warmup: int = param(1, "Untimed runs before the timed ones.", ge=0, le=100)
    repeats: int = param(5, "Timed runs; the table keeps their median and spread.", ge=1, le=1000)

    @property
    def context(self) -> int:
        """Tokens a sequence holds at the end: prompt + generated."""
        return self.prompt + self.generate

    def as_dict(self) -> dict:
        """The fields: what the cost table is keyed by (with the runtime's machine)."""
        return asdict(self)

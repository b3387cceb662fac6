"""A stand-in for a GPU's copies to the host (zgdata/core/host_copy.py) that the CPU can run: each copy is under
way until it is waited for, and its buffers stay empty until then, so a consumer that reads a batch before waiting
for its copy finds no boundary in it."""

from __future__ import annotations

from zgdata.core.host_copy import HostCopy


def deferred_to_host(log: list):
    """A ``host_copy.to_host`` that logs ("launch", i) and ("wait", i) in order and fills its buffers at the wait."""

    def to_host(tensors: dict) -> HostCopy:
        i = sum(1 for e in log if e[0] == "launch")
        log.append(("launch", i))
        out: dict = {}

        def sync() -> None:
            log.append(("wait", i))
            out.update({k: v.clone() for k, v in tensors.items()})

        return HostCopy(out, sync, tensors)

    return to_host


def one_behind(batches: int) -> list:
    """The log of ``batches`` batches whose copies are each waited for after the next batch's launch."""
    want = [("launch", 0)] + [e for i in range(1, batches) for e in (("launch", i), ("wait", i - 1))]
    return want + [("wait", batches - 1)]

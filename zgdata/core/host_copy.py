"""Boundaries between a GPU and host memory while the GPU computes.

Materialize's forward thread used to end each batch with a synchronous ``.cpu()`` of every boundary: on a GPU the
thread waits for the forward, then for a copy from the device into pageable memory, and only then launches the next
forward, so the copy is serialized with the compute. An 8B teacher's batch of 4 x 2,048 tokens holds 9 boundaries
of 64 MB: 576 MB, about 50 ms at the 10-12 GB/s of pageable copies, after a forward of about 330 ms.

``to_host`` starts the copies on a side stream of their own into pinned memory (torch's caching host allocator),
after everything already queued on the forward's stream, and returns at once; ``one_ahead`` launches batch i+1's
forward before it waits for batch i's copies, so the GPU's copy engine moves batch i while its cores run batch
i+1. A copy is bit for bit, so the boundaries are the same whichever way they arrive.

Training reads the other way: ``to_device``, called by the loader's thread, pins a batch and copies it to the GPU on
a side stream while the step before trains; the training thread's stream waits for that copy (on the GPU, not in
Python) when it takes the batch (``DeviceCopy.ready``).

On the CPU there is nothing to copy: ``to_host`` hands the tensors back, done, and ``one_ahead`` yields each batch
as soon as it is launched, in the order and at the time the loop did before; ``to_device`` hands them back as
they are. Other devices copy synchronously.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

import torch
import torch.utils.deterministic

from zgdata.core.timing import span

__all__ = ["HostCopy", "to_host", "one_ahead", "release", "DeviceCopy", "to_device"]

T = TypeVar("T")

_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}  # (CUDA device index, direction) -> the stream copying
_FILL_LOCK = threading.Lock()
_STREAMS_LOCK = threading.Lock()


class HostCopy:
    """Tensors on their way to host memory. ``done``: nothing to wait for. ``wait()`` returns them on the CPU and
    lets go of the device tensors they are copied from (held until then, so their memory is not reused while the
    copy reads it)."""

    __slots__ = ("_out", "_sync", "_source")

    def __init__(self, out: dict, sync: Callable[[], None] | None = None, source: dict | None = None):
        self._out, self._sync, self._source = out, sync, source

    @property
    def done(self) -> bool:
        return self._sync is None

    def wait(self) -> dict:
        if self._sync is not None:
            self._sync()
            self._sync = self._source = None
        return self._out


def _copy_stream(device: torch.device, direction: str) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, direction)
    with _STREAMS_LOCK:  # a loader's thread and the training thread may both ask
        if key not in _STREAMS:
            _STREAMS[key] = torch.cuda.Stream(device=index)
        return _STREAMS[key]


@contextmanager
def _unfilled():
    """Skip torch's fill of new memory. Under ``torch.use_deterministic_algorithms`` (every CUDA run of zg:
    runtime.deterministic_cuda) each new tensor is first filled with NaN, so a kernel that leaves part of its output
    unwritten stays deterministic; a copy's destination is written whole, and the fill would cost a core about 60-140
    ms for an 8B teacher's 576 MB batch (a bf16 ``torch.empty`` of 64 MB took 16 ms on this project's CPU host).

    The flag is process-wide, and ``torch.empty`` lets go of the GIL: a tensor another thread makes while the
    buffers are allocated (a few ms when the host cache has to grow, ``cudaHostAlloc``) is not filled either, which
    no zg thread relies on (the encoding threads' torch ops write their outputs whole). The lock keeps two callers
    from leaving the flag off."""
    det = torch.utils.deterministic
    with _FILL_LOCK:
        was = det.fill_uninitialized_memory
        det.fill_uninitialized_memory = False
        try:
            yield
        finally:
            det.fill_uninitialized_memory = was


def to_host(tensors: dict) -> HostCopy:
    """Start copying ``{key: tensor}`` (on one device) to host memory; ``HostCopy.wait()`` gives the CPU tensors.

    CUDA: pinned buffers, ``copy_(non_blocking=True)`` on a side stream that first waits for the current stream's
    queued work, and an event (blocking: the waiting thread sleeps, leaving its core to the encoding threads)."""
    devices = {t.device for t in tensors.values()}
    if devices <= {torch.device("cpu")}:
        return HostCopy(dict(tensors))
    if len(devices) > 1 or next(iter(devices)).type != "cuda":
        return HostCopy({k: v.cpu() for k, v in tensors.items()})
    device = next(iter(devices))
    side = _copy_stream(device, "to_host")
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.device(side.device), torch.cuda.stream(side):  # the device guard: see to_device
        with _unfilled():
            out = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in tensors.items()}
        for k, v in tensors.items():
            out[k].copy_(v, non_blocking=True)
        event = torch.cuda.Event(blocking=True)
        event.record(side)
    return HostCopy(out, event.synchronize, dict(tensors))


def one_ahead(
    items: Iterable[T], launch: Callable[[T], HostCopy], *, wait_span: str = "to_host"
) -> Iterator[tuple[T, dict]]:
    """``(item, launch(item).wait())`` for every item, in order. A copy still under way is waited for only after
    the next item is launched (at most one waits at a time); a done copy is yielded at once. ``wait_span`` names
    the time spent waiting (zgdata.core.timing)."""
    pending: tuple[T, HostCopy] | None = None
    try:
        for item in items:
            copy = launch(item)
            before, pending = pending, (item, copy)
            if before is not None:
                with span(wait_span):
                    got = before[1].wait()
                yield before[0], got
            if copy.done:
                pending = None
                yield item, copy.wait()
        if pending is not None:
            with span(wait_span):
                got = pending[1].wait()
            yield pending[0], got
    finally:
        # a run that ends early (an error, the consumer gone) still lets a copy in flight end before its device
        # source can be freed and reused (a copy waited for already returns at once)
        if pending is not None:
            with suppress(Exception):
                pending[1].wait()


def release(device: torch.device | None = None) -> None:
    """Give back the pinned buffers torch's host allocator keeps cached (free blocks only): a process would otherwise
    keep its peak backlog of batches page-locked after its run (a Ray worker may run more shards). ``device``: first
    let the copies to it still under way end (a loader's batches dropped unused), so their buffers are free too.

    A cleanup: it runs in ``finally`` blocks, and an error here (a CUDA error already raised) never hides the one
    that ended the run."""
    if not torch.cuda.is_initialized():
        return
    with suppress(Exception):
        if device is not None and device.type == "cuda":
            _copy_stream(device, "to_device").synchronize()
        accelerator = getattr(torch, "accelerator", None)
        free = getattr(accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
        if free is not None:
            free()


class DeviceCopy:
    """Tensors on their way to a device. ``ready()`` returns them for use on the calling thread's current stream:
    that stream waits for the copy (queued on the GPU; Python does not wait), and the tensors' memory, allocated on
    the copy's stream, is kept until that stream's work on them is done."""

    __slots__ = ("_out", "_event")

    def __init__(self, out: tuple, event=None):
        self._out, self._event = out, event

    def ready(self) -> tuple:
        if self._event is not None:
            stream = torch.cuda.current_stream(self._out[0].device)
            stream.wait_event(self._event)
            for t in self._out:
                t.record_stream(stream)
            self._event = None
        return self._out


def to_device(tensors: tuple, device: torch.device | None) -> DeviceCopy:
    """Start copying CPU ``tensors`` to a CUDA ``device`` from the calling thread (pinned first, then
    ``non_blocking`` on a side stream); any other device, or none, gets them back as they are (its consumer moves
    them, as before)."""
    if device is None or device.type != "cuda" or not tensors or any(t.device.type != "cpu" for t in tensors):
        return DeviceCopy(tuple(tensors))
    side = _copy_stream(device, "to_device")
    # the copy's device made current first: leaving a stream context restores the thread's own stream with
    # cudaSetDevice of the thread's device, which in a new thread is GPU 0 and would open a context there (hundreds
    # of MB) on a run that uses cuda:N
    with torch.cuda.device(side.device), torch.cuda.stream(side):
        out = tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)
        event = torch.cuda.Event()
        event.record(side)
    return DeviceCopy(out, event)

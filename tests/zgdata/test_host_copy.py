"""Copies of boundaries between host memory and a GPU (zgdata/core/host_copy.py). To the host: on the CPU a batch is
handed on as soon as it is captured; a copy still under way (a GPU's) is waited for only after the next batch is
launched, one at a time, in order. To the device: the training loader's thread starts each batch's copy, and the
training thread takes it in step order. The CUDA paths themselves need a GPU: bench/gpu_check.py's materialize,
verify and cached_online checks run them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zgdata.core import host_copy
from zgdata.core.host_copy import DeviceCopy, HostCopy, one_ahead, to_device, to_host
from zgdata.core.timing import collect


def test_cpu_tensors_are_handed_back_as_they_are_with_nothing_to_wait_for():
    a, b = torch.arange(6).view(2, 3), torch.ones(4, dtype=torch.bfloat16)
    copy = to_host({1: a, 3: b})
    assert copy.done
    got = copy.wait()
    assert list(got) == [1, 3] and got[1] is a and got[3] is b
    assert to_host({}).done and to_host({}).wait() == {}


def _deferred(log: list, i: int, source: dict) -> HostCopy:
    """A copy that is not done until waited for, as a GPU's: its wait is logged."""
    return HostCopy({k: v.clone() for k, v in source.items()}, lambda: log.append(("wait", i)), source)


def test_a_copy_under_way_is_waited_for_after_the_next_launch_one_at_a_time():
    log: list = []

    def launch(i):
        log.append(("launch", i))
        return _deferred(log, i, {0: torch.full((2,), i)})

    with collect() as t:
        for i, got in one_ahead(range(4), launch, wait_span="test.wait"):
            log.append(("yield", i))
            assert torch.equal(got[0], torch.full((2,), i))
    want = [("launch", 0), ("launch", 1), ("wait", 0), ("yield", 0)]
    want += [("launch", 2), ("wait", 1), ("yield", 1), ("launch", 3), ("wait", 2), ("yield", 2)]
    assert log == want + [("wait", 3), ("yield", 3)]
    assert t["test.wait"].count == 4
    assert list(one_ahead([], launch)) == []


def test_done_copies_are_handed_on_at_once_and_a_deferred_one_keeps_its_place():
    log: list = []

    def launch(i):
        log.append(("launch", i))
        t = {0: torch.tensor([i])}
        return _deferred(log, i, t) if i in (1, 2) else to_host(t)

    order = [(i, int(got[0])) for i, got in one_ahead(range(5), launch) if not log.append(("yield", i))]
    assert order == [(i, i) for i in range(5)]
    assert log == [
        ("launch", 0),
        ("yield", 0),
        ("launch", 1),
        ("launch", 2),
        ("wait", 1),
        ("yield", 1),
        ("launch", 3),
        ("wait", 2),
        ("yield", 2),
        ("yield", 3),
        ("launch", 4),
        ("yield", 4),
    ]


def test_waiting_lets_go_of_the_source_tensors_once():
    log: list = []
    src = {0: torch.zeros(3)}
    copy = _deferred(log, 7, src)
    assert not copy.done and copy._source is src
    first, second = copy.wait(), copy.wait()
    assert first is second and copy.done and copy._source is None and log == [("wait", 7)]


def test_a_loop_that_ends_early_still_waits_for_the_copy_in_flight():
    """A launch that fails ends the loop with its error, and so does a consumer that stops: the copy still under
    way is waited for first (its device source must not be freed while the copy reads it); its batch is not
    handed on, and a resume captures it again."""
    log: list = []

    def launch(i):
        if i == 2:
            raise RuntimeError("forward failed")
        return _deferred(log, i, {0: torch.tensor([i])})

    seen = []
    with pytest.raises(RuntimeError, match="forward failed"):
        for i, _ in one_ahead(range(4), launch):
            seen.append(i)
    assert seen == [0] and log == [("wait", 0), ("wait", 1)]

    log.clear()
    loop = one_ahead(range(4), lambda i: _deferred(log, i, {0: torch.tensor([i])}))
    assert next(loop)[0] == 0 and log == [("wait", 0)]
    loop.close()  # the consumer stops (a writer error in materialize): batch 1's copy is in flight
    assert log == [("wait", 0), ("wait", 1)]


def test_the_deterministic_fill_is_skipped_only_inside_and_comes_back_after_an_error():
    """A CUDA run is strict-deterministic (torch fills each new tensor with NaN); a copy's pinned destination skips
    the fill, and the process's setting is restored however the block ends."""
    from zgdata.core.host_copy import _unfilled

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.isnan(torch.empty(8)).all()
        with _unfilled():
            assert torch._C._get_deterministic_fill_uninitialized_memory() is False
        assert torch._C._get_deterministic_fill_uninitialized_memory() is True
        with pytest.raises(RuntimeError, match="copy failed"), _unfilled():
            raise RuntimeError("copy failed")
        assert torch._C._get_deterministic_fill_uninitialized_memory() is True and torch.isnan(torch.empty(8)).all()
    finally:
        torch.use_deterministic_algorithms(before)


def test_batches_for_the_cpu_or_no_device_are_handed_back_as_they_are():
    x, y = torch.ones(2, 3, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.bfloat16)
    for dev in (None, torch.device("cpu")):
        got = to_device((x, y), dev).ready()
        assert got[0] is x and got[1] is y


def test_the_loader_thread_starts_each_copy_and_the_training_thread_takes_them_in_step_order(tiny_built, monkeypatch):
    """BoundaryPair.batches with a device: the loading thread starts every batch's copy (``to_device``), the
    consuming thread takes each (``ready``) as it yields it, in step order, and the batches are the ones read without
    a device, bit for bit (here a copy that is a clone, made in the loader's thread, stands for a GPU's)."""
    import threading

    from zgdata.layout import Layout
    from zgdata.store.reader import BoundaryPair

    layout = Layout(tiny_built)
    want = list(
        BoundaryPair(layout.boundary("h00"), layout.boundary("h02")).batches(
            "train", start_step=1, steps=5, batch_size=4, seed=3
        )
    )
    log: list = []

    class Deferred(DeviceCopy):
        def ready(self):
            log.append(("ready", threading.current_thread().name, int(self._out[0][0, 0, 0].view(torch.int16))))
            return self._out

    def started(tensors, device):
        assert device == torch.device("cuda", 5)  # passed through as given; nothing here touches CUDA
        log.append(("start", threading.current_thread().name))
        return Deferred(tuple(t.clone() for t in tensors))

    monkeypatch.setattr(host_copy, "to_device", started)
    pair = BoundaryPair(layout.boundary("h00"), layout.boundary("h02"))
    got = list(pair.batches("train", start_step=1, steps=5, batch_size=4, seed=3, device=torch.device("cuda", 5)))
    me = threading.current_thread().name
    starts = [e[1] for e in log if e[0] == "start"]
    assert len(starts) == 4 and me not in starts
    readies = [e for e in log if e[0] == "ready"]
    assert len(readies) == 4 and all(e[1] == me for e in readies)
    assert [e[2] for e in readies] == [int(x[0, 0, 0].view(torch.int16)) for _, _, x, _ in want]
    assert [s for s, *_ in got] == [1, 2, 3, 4]
    for (_, ra, xa, ya), (_, rb, xb, yb) in zip(want, got):
        assert np.array_equal(ra, rb)
        assert torch.equal(xa.view(torch.int16), xb.view(torch.int16))
        assert torch.equal(ya.view(torch.int16), yb.view(torch.int16))


def test_the_loader_names_the_gpu_before_its_thread_starts_and_gives_back_pinned_batches_once_it_ends(
    tiny_built, monkeypatch
):
    """``cuda`` without an index is made the caller's current GPU before the loading thread starts (that thread's
    own current device would be GPU 0), and the pinned batches are given back once, after the thread has ended,
    also when the consumer stops early. Nothing here touches CUDA: the copy and the current device are stand-ins."""
    import threading

    from zgdata.layout import Layout
    from zgdata.store.reader import BoundaryPair

    layout = Layout(tiny_built)
    log: list = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    loader: list = []  # the loading thread (the one that starts the copies)

    def start(tensors, device):
        loader.append(threading.current_thread())
        log.append(("start", device))
        return DeviceCopy(tuple(tensors))

    monkeypatch.setattr(host_copy, "to_device", start)
    monkeypatch.setattr(
        host_copy, "release", lambda device=None: log.append(("release", device, any(t.is_alive() for t in loader)))
    )
    pair = BoundaryPair(layout.boundary("h00"), layout.boundary("h02"))
    for stop_after in (None, 1):
        log.clear()
        loop = pair.batches("train", start_step=0, steps=4, batch_size=4, seed=0, device=torch.device("cuda"))
        got = [next(loop) for _ in range(stop_after)] if stop_after else list(loop)
        loop.close()
        starts, releases = [e for e in log if e[0] == "start"], [e for e in log if e[0] == "release"]
        assert len(got) == (stop_after or 4) and starts and {e[1] for e in starts} == {torch.device("cuda", 3)}
        assert loader and threading.current_thread() not in loader
        # once, last, with the loading thread ended
        assert releases == [("release", torch.device("cuda", 3), False)] and log[-1] == releases[0]
        loader.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_reach_the_device_bit_for_bit_before_the_stream_uses_them():
    x = torch.randn(4, 64, 32).to(torch.bfloat16)
    dev = torch.device("cuda")
    got = to_device((x, x + 1), dev).ready()
    assert got[0].device.type == "cuda"
    assert torch.equal(got[0].cpu().view(torch.int16), x.view(torch.int16))
    assert torch.equal(got[1].cpu().view(torch.int16), (x + 1).view(torch.int16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_boundaries_arrive_in_pinned_memory_bit_for_bit():
    x = {k: torch.randn(4, 64, 32, device="cuda").to(torch.bfloat16) for k in (2, 4)}
    got = to_host(x).wait()
    for k in x:
        assert got[k].is_pinned() and got[k].device.type == "cpu"
        assert torch.equal(got[k].view(torch.int16), x[k].cpu().view(torch.int16))

"""zgdata/core/host_copy.py under forced races: each copy is queued behind a GPU sleep, so a missing wait reads
a buffer before its copy ends (bench/gpu_check.py's `copies` check; the CPU runs it as a smoke test, where there
is nothing to race).

    ZG_DEVICE=cuda python bench/host_copy_race.py       # prints one JSON object; exit 1 if a copy differs

On a tiny project the copies take microseconds and every training step waits for its loss, so the bitwise checks
of materialize (verify) and training (cached_online) would likely pass even with a wait missing. Here:
  to_host    the forward's stream sleeps, then makes the boundary: the side stream must wait for it before copying
  to_device  the copy's own stream sleeps first: the training stream must wait for the copy before reading
  kept       the training stream sleeps, then reads the batch, which is then dropped, and the next batch is copied:
             without record_stream, the next copy could reuse the batch's memory before the read ran
"""

from __future__ import annotations

import json
import sys

import torch

SPIN_CYCLES = 10**8  # torch.cuda._sleep: about 50-70 ms at a GPU's 1.4-2 GHz


def _sleep(stream=None) -> None:
    if stream is None:
        torch.cuda._sleep(SPIN_CYCLES)
        return
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SPIN_CYCLES)


def run(dev: torch.device) -> dict:
    """{'to_host': bool, 'to_device': bool, 'kept': bool}: each copy's bits equal its source's."""
    from zgdata.core import host_copy

    cuda = dev.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(4, 2048, 1024, generator=gen).to(torch.bfloat16)  # 16 MB, as one boundary of 4 x 2,048 x 1,024
    other = torch.randn(4, 2048, 1024, generator=gen).to(torch.bfloat16)
    bits = lambda t: t.cpu().view(torch.int16)  # noqa: E731
    out = {}

    on_dev = src.to(dev)
    if cuda:
        torch.cuda.synchronize(dev)
        _sleep()
    y = on_dev * 1  # queued behind the sleep on the forward's stream
    out["to_host"] = torch.equal(host_copy.to_host({0: y}).wait()[0].view(torch.int16), src.view(torch.int16))

    if cuda:
        _sleep(host_copy._copy_stream(dev, "to_device"))
    (x,) = host_copy.to_device((src,), dev).ready()
    out["to_device"] = torch.equal(bits(x.to(dev)), src.view(torch.int16))

    (x,) = host_copy.to_device((src,), dev).ready()
    if cuda:
        torch.cuda.synchronize(dev)
        _sleep()
    z = x.to(dev) * 1  # queued behind the sleep on the training stream
    del x
    (w,) = host_copy.to_device((other,), dev).ready()
    out["kept"] = torch.equal(bits(z), src.view(torch.int16)) and torch.equal(bits(w.to(dev)), other.view(torch.int16))
    return out


def main() -> int:
    from zgdata.core.runtime import device, prefer_gpu

    prefer_gpu()
    dev = device()
    res = run(dev)
    print(json.dumps({"device": str(dev), **res}))
    return 0 if all(res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

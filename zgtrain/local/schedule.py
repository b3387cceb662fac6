"""When each isolated block's backward and optimizer step are issued within one training step.

- ``phased``: every block's forward, then every block's backward and step, in block order.
- ``early_backward``: block k's backward and step are issued as soon as its forward ends, before
  block k+1's forward. On CUDA each block runs on its own stream (autograd runs a backward op on
  its forward's stream), so block k's backward overlaps block k+1's forward, which waits only on
  an event marking the end of block k's forward. On CPU the same order runs serially.

Block k+1 reads ``h.detach()`` of block k, which no backward or step writes, and no block's update
reads another block's tensors: both schedules do the same arithmetic on the same values, so the
parameters after N steps are bitwise equal (tests/zgtrain/local/test_local.py checks it on CPU).
Neither schedule synchronizes with the device: losses come back as tensors.
"""

from __future__ import annotations

import torch

__all__ = ["SCHEDULES", "update"]


def update(run, i: int, loss: torch.Tensor) -> None:
    """Block i's backward, clip and AdamW step (no host sync: the norm stays a tensor)."""
    blk, opt, clip = run.blocks[i], run.opts[i], run.bcfgs[i].grad_clip
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(blk.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def phased(run, batch: torch.Tensor) -> list:
    out, x = [], batch
    for blk in run.blocks:
        h, loss, terms = blk(x, batch, mtp_weight=run.cfg.mtp_weight)
        out.append((loss, terms))
        x = h.detach()
    for i, (loss, _) in enumerate(out):
        update(run, i, loss)
    return out


def early_backward(run, batch: torch.Tensor) -> list:
    if batch.device.type == "cuda":
        return _early_cuda(run, batch)
    out, x = [], batch
    for i, blk in enumerate(run.blocks):
        h, loss, terms = blk(x, batch, mtp_weight=run.cfg.mtp_weight)
        x = h.detach()
        update(run, i, loss)
        out.append((loss.detach(), terms))
    return out


def _early_cuda(run, batch: torch.Tensor) -> list:
    main = torch.cuda.current_stream(batch.device)
    streams = run.state.setdefault("streams", [torch.cuda.Stream(batch.device) for _ in run.blocks])
    out, x, ready = [], batch, None
    for i, blk in enumerate(run.blocks):
        s = streams[i]
        s.wait_stream(main)  # the batch, the lr just set
        if ready is not None:
            s.wait_event(ready)  # only the previous block's forward, not its backward
        with torch.cuda.stream(s):
            batch.record_stream(s)
            x.record_stream(s)  # allocated on the previous block's stream: keep it alive for this one
            h, loss, terms = blk(x, batch, mtp_weight=run.cfg.mtp_weight)
            x = h.detach()
            ready = torch.cuda.Event()
            ready.record(s)
            update(run, i, loss)
            out.append((loss.detach(), terms))
    for s in streams:
        main.wait_stream(s)
    return out


SCHEDULES = {"phased": phased, "early_backward": early_backward}

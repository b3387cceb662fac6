"""Encode, checksum and stats of captured boundaries on a pool of threads, handed back in row order.

One thread that encodes every boundary of every batch in turn makes about 0.2 GB/s (zstd level 3 and
blake2b, docs/results/write-path.md), while an 8B teacher on one GPU makes 1.4-2.2 GB/s of boundary
bytes. Each (batch, boundary) pair is therefore one job on a pool of ``materialize.writer_threads``
threads: zstd, xxhash, numpy and torch release the GIL, so the jobs run on as many cores. A job
builds the whole Lance record batch of its boundary, exactly the batch one thread would build, and the
batches leave the pool in submission order, so the Lance streams receive the same batches in the same
order whatever the thread count: the data files hold the same bytes (tests/zgdata/materialize/
test_write_path.py hashes each one). Stats are exact integer sums (zgdata/materialize/stats.py), so
their order does not matter either.

A batch stays in flight until the batches after it hold jobs enough for every thread (``ceil(threads /
boundaries)`` batches, at least one): the capturing thread hands over a batch and goes on with the next
forward while the pool encodes, no core waits on one boundary while another batch waits, and memory stays
a few batches (an 8B teacher's batch of 4 x 2048 tokens is 600 MB over 9 boundaries; 16 threads keep 3).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import torch

from zgdata.core.runtime import serial_torch_thread
from zgdata.materialize import stats as boundary_stats
from zgdata.store.codec import hidden_arrays, planes
from zgdata.store.integrity import checksum_array
from zgdata.store.quant import is_quantized

__all__ = ["Encoded", "Encoder", "encode_batch"]


class Encoded:
    """One boundary of one batch, ready to stream: its Lance record batch, stats and decoded bytes."""

    __slots__ = ("batch", "stats", "nbytes")

    def __init__(self, batch: pa.RecordBatch, stats: dict, nbytes: int):
        self.batch, self.stats, self.nbytes = batch, stats, nbytes


def encode_batch(
    x: torch.Tensor, rows: np.ndarray, splits, *, schema: pa.Schema, storage_dtype: str, codec: str, checksum: str
) -> Encoded:
    """One (B, T, C) boundary batch in the storage dtype -> its record batch (seq_id, split, values, checksum)."""
    values, bits = hidden_arrays(x, storage_dtype, codec)
    if is_quantized(codec):  # the stats describe the stored values; the error is theirs against the teacher's
        stored = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).reshape(x.shape)
        stats = boundary_stats.batch_stats(stored)
        stats.update(boundary_stats.error_stats(planes(x, storage_dtype).reshape(x.shape), bits.reshape(x.shape)))
    else:
        stats = boundary_stats.batch_stats(x)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(rows, type=pa.int64()), pa.array(splits), *values, checksum_array(bits, algo=checksum)],
        schema=schema,
    )
    return Encoded(batch, stats, x.numel() * x.element_size())


class Encoder:
    """A pool of ``threads`` encoding threads; ``submit`` a batch's boundaries, ``done`` yields them in order.

    ``threads`` 0 encodes in the calling thread at ``submit`` (no pool: what a test or a one-core worker
    may want); the bytes are the same either way.
    """

    def __init__(self, *, threads: int, schema: pa.Schema, storage_dtype: str, codec: str, checksum: str):
        self.threads = threads
        self.kw = dict(schema=schema, storage_dtype=storage_dtype, codec=codec, checksum=checksum)
        # each thread's torch ops (the stats) run on that thread: the pool is the parallelism (runtime.py)
        self.pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="zg-encode", initializer=serial_torch_thread)
            if threads > 0
            else None
        )
        self.pending: deque[tuple[np.ndarray, dict[str, Future | Encoded]]] = deque()
        self.width = 1  # boundaries per batch, from the last submit

    def submit(self, rows: np.ndarray, splits, caps: dict[str, torch.Tensor]) -> None:
        """Queue every boundary of one batch (``caps``: name -> (B, T, C) tensor in the storage dtype)."""
        self.width = max(1, len(caps))
        if self.pool is None:
            jobs = {n: encode_batch(x, rows, splits, **self.kw) for n, x in caps.items()}
        else:
            jobs = {n: self.pool.submit(encode_batch, x, rows, splits, **self.kw) for n, x in caps.items()}
        self.pending.append((rows, jobs))

    def done(self, *, keep: int | None = None):
        """Yield (rows, {name: Encoded}) of the oldest batches, in submission order, until at most ``keep``
        remain in flight (default: the batches that hold a job for every thread; 0: drain)."""
        keep = max(1, -(-self.threads // self.width)) if keep is None else keep
        while len(self.pending) > keep:
            rows, jobs = self.pending.popleft()
            yield rows, {n: j.result() if isinstance(j, Future) else j for n, j in jobs.items()}

    def close(self) -> None:
        """Drop what is in flight (an aborted group) and stop the threads."""
        for _, jobs in self.pending:
            for j in jobs.values():
                if isinstance(j, Future):
                    j.cancel()
        self.pending.clear()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

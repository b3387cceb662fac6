"""Side effects in one place: device selection, seeding and random-state capture.

Everything else takes tensors and explicit ``torch.Generator`` objects. The device is
CPU unless ``ZG_DEVICE`` says otherwise (e.g. ``cuda`` or ``cuda:1``); tests and the
default conversion never need a GPU. Bitwise guarantees hold per device: a run and its
resume (or its cached/online twin) must use the same device. This module is the only one that reads ``ZG_DEVICE``.

torch loads when a function here needs it, not with the module: a driver that runs no model (``zg repro``) asks
for the device type on the CPU without paying for torch.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import numpy as np

from zgdata.errors import ZgError

if TYPE_CHECKING:
    import torch

__all__ = [
    "device",
    "device_type",
    "set_device",
    "prefer_gpu",
    "device_named",
    "use_assigned_gpu",
    "deterministic_cuda",
    "seed_all",
    "rng_state",
    "set_rng_state",
    "set_threads",
    "serial_torch_thread",
    "writer_threads",
    "autocast",
]


DEVICE_ENV = "ZG_DEVICE"


def _device_name() -> str:
    return os.environ.get(DEVICE_ENV, "cpu")


def device_type() -> str:
    """The type ("cpu", "cuda") of the device ``ZG_DEVICE`` names, checked like ``device``; torch loads only for a
    device other than the CPU."""
    if _device_name() == "cpu":
        return "cpu"
    return device().type


def set_device(name: str) -> None:
    """Make ``name`` this process's device (a Ray worker of a joined cluster does not inherit the driver's env)."""
    os.environ[DEVICE_ENV] = name


def device_named() -> bool:
    """Whether ``ZG_DEVICE`` names the device (a user's choice), rather than the default or ``prefer_gpu``'s."""
    return DEVICE_ENV in os.environ


def prefer_gpu() -> None:
    """Where ``ZG_DEVICE`` is unset, choose ``cuda`` if torch sees a GPU, else the CPU: what a script made for a
    GPU machine wants (bench/gpu_check.py); the package's own default stays the CPU."""
    if DEVICE_ENV not in os.environ:
        import torch

        set_device("cuda" if torch.cuda.is_available() else "cpu")


def use_assigned_gpu() -> None:
    """In a Ray task given a GPU: Ray made that GPU the only visible one (CUDA_VISIBLE_DEVICES), so ``cuda:N``
    becomes ``cuda``."""
    if _device_name().startswith("cuda"):
        set_device("cuda")


def device() -> torch.device:
    """The torch device ``ZG_DEVICE`` names (CPU by default), with CUDA's nondeterministic shortcuts turned off."""
    import torch

    name = _device_name()
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ZgError(f"ZG_DEVICE={name!r} is not a torch device", fix="use cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ZgError(
            f"ZG_DEVICE={name} but this torch has no CUDA device",
            fix="unset ZG_DEVICE, or replace this torch with a CUDA build (`make clean-venv`, then `make setup "
            "TORCH_SPEC='torch==VERSION --index-url <your CUDA wheel index>'`)",
        )
    if dev.type == "cuda":
        deterministic_cuda()
    return dev


def deterministic_cuda() -> None:
    """Turn off CUDA's nondeterministic shortcuts for this process: determinism over speed, the guarantees are
    bitwise (TF32 off, cuDNN without benchmarking, cuBLAS's fixed workspace, torch's deterministic kernels)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # the deterministic kernels where torch has them, and an error naming the op where it has none. Strict, not
    # warn_only: SDPA's memory-efficient and flash backward keep their nondeterministic split of the key
    # reduction under warn_only (they only warn); only the strict mode makes them take one split
    torch.use_deterministic_algorithms(True)


def set_threads(n: int) -> None:
    """Use exactly ``n`` torch CPU threads in this process (``train.threads``, ``materialize.worker_threads``:
    what a Ray task asked for, its share of the cores).

    On CPU the count is part of a run's bits: a reduction split across threads adds in another order
    (measured: ``x.sum()`` of a 2048 x 1536 float32 tensor differs in its last bits between 1 and 2
    threads), so a run and its resume must use the same count.
    """
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def serial_torch_thread() -> None:
    """Run the calling thread's torch CPU ops on that thread alone; every other thread keeps its count.

    For the threads of a pool that is itself the parallelism (materialize's encoding threads): otherwise each op
    on a large tensor opens an OpenMP team of ``torch.get_num_threads()`` threads from every pool thread, so 15
    encoding threads on a 16-core GPU box would each start 16, and their spin-waits take the cores the other
    jobs and Lance's writers need. Measured on 2 cores, the encoding pool alone on one thread: raw rows (the stats
    are most of their job) 1.09 -> 0.82 core-seconds per GB, zstd_fast 2.71 -> 2.54 (bench/encode_pool.py,
    docs/results/write-path.md, fifth pass).

    torch reads a thread's OpenMP count, which is per thread, on the thread's first op, and sets it then from the
    process's count: so this makes that first call, then limits this thread's OpenMP runtime through
    ``threadpoolctl``. Results do not change: the ops the pool runs (``stats.batch_stats``) reduce each token
    within one thread at any count (tests/zgdata/materialize/test_write_path.py compares them). Where torch uses
    no OpenMP (some builds), there is nothing to limit and this does nothing."""
    import torch

    torch.get_num_threads()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="openmp")


def cores() -> int:
    """CPU cores this process may use: its affinity (taskset, a cpuset) and its cgroup's CPU quota (a container's
    ``--cpus``, a Kubernetes CPU limit), whichever is smaller, at least 1. joblib's count (loky's, cgroup v1 and v2;
    ``LOKY_MAX_CPU_COUNT`` caps it): a pod limited to 8 CPUs on a 224-core GPU node would otherwise start 223
    encoding threads (``writer_threads``) that its quota then throttles."""
    from joblib import cpu_count

    return max(1, int(cpu_count(only_physical_cores=False)))


def writer_threads(n: int) -> int:
    """Encoding threads of materialize's write path (``materialize.writer_threads``); 0: the cores left after the
    forward: every core but one beside a GPU (the thread that drives it), the cores beyond torch's threads on CPU;
    at least 1. The count changes no byte on disk (zgdata/materialize/encode.py)."""
    import torch

    if n > 0:
        return n
    busy = torch.get_num_threads() if device().type == "cpu" else 1
    return max(1, cores() - busy)


def autocast(dev: torch.device, precision: str):
    """The ``train.precision`` context for a block's forward and loss: fp32 (no-op) or bf16 autocast."""
    import contextlib

    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev.type, dtype=compute_dtype(precision))


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a ``precision`` setting: fp32 or bf16."""
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


def seed_all(seed: int) -> torch.Generator:
    """Seed torch, numpy and Python's global RNGs from ``seed``; return a CPU generator seeded the same.

    Code that draws random numbers takes that generator explicitly; the global seeds only make
    any library code that draws implicitly deterministic too.
    """
    import torch

    torch.manual_seed(seed % (2**63))
    np.random.seed(seed % (2**32))
    random.seed(seed)
    return torch.Generator().manual_seed(seed % (2**63))


def rng_state(gen: torch.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    """Every random state a run depends on, as (tensors, JSON-able values): no pickles, so no code on load."""
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    tensors = {
        "block": gen.get_state(),
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    values = {
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    return tensors, values


def set_rng_state(gen: torch.Generator, tensors: dict[str, torch.Tensor], values: dict) -> None:
    """Restore what ``rng_state`` captured."""
    import torch

    gen.set_state(tensors["block"])
    torch.set_rng_state(tensors["torch"])
    n = values["numpy"]
    np.random.set_state(
        (n["kind"], tensors["numpy_keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = values["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))

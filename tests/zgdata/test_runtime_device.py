"""Device selection (zgdata/core/runtime.py): the one module that reads and sets ZG_DEVICE."""

from __future__ import annotations

import os

import pytest
import torch

from zgdata.core import runtime
from zgdata.errors import ZgError


def test_cpu_is_the_default_and_a_bad_name_is_refused(monkeypatch):
    monkeypatch.delenv(runtime.DEVICE_ENV, raising=False)
    assert runtime.device_type() == "cpu" and runtime.device() == torch.device("cpu")
    monkeypatch.setenv(runtime.DEVICE_ENV, "nonsense")
    with pytest.raises(ZgError, match="ZG_DEVICE='nonsense' is not a torch device"):
        runtime.device_type()


def test_a_ray_task_given_a_gpu_uses_the_one_ray_made_visible(monkeypatch):
    monkeypatch.setenv(runtime.DEVICE_ENV, "cuda:3")
    runtime.use_assigned_gpu()
    assert os.environ[runtime.DEVICE_ENV] == "cuda"
    monkeypatch.setenv(runtime.DEVICE_ENV, "cpu")
    runtime.use_assigned_gpu()
    assert os.environ[runtime.DEVICE_ENV] == "cpu"


def test_prefer_gpu_fills_in_only_an_unset_device(monkeypatch):
    monkeypatch.setenv(runtime.DEVICE_ENV, "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    runtime.prefer_gpu()
    assert os.environ[runtime.DEVICE_ENV] == "cpu"  # what the user set stays
    monkeypatch.delenv(runtime.DEVICE_ENV)
    runtime.prefer_gpu()
    assert os.environ[runtime.DEVICE_ENV] == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(runtime.DEVICE_ENV)
    runtime.prefer_gpu()
    assert os.environ[runtime.DEVICE_ENV] == "cpu"


def test_set_threads_sets_torch_s_thread_count():
    """``set_threads(n)`` leaves torch on exactly ``n`` CPU threads (a run's bits depend on the count)."""
    before = torch.get_num_threads()
    n = 2 if before != 2 else 1
    try:
        runtime.set_threads(n)
        assert torch.get_num_threads() == n
        runtime.set_threads(n)  # already n: unchanged
        assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(before)


def test_cuda_runs_in_torchs_strict_deterministic_mode(monkeypatch):
    """What `device()` sets up for CUDA (run here on the CPU, and undone): torch's deterministic kernels, strictly.
    Under ``warn_only`` SDPA's memory-efficient and flash backward only warn and keep adding their key blocks in any
    order, so a block trained on a GPU would miss its own resume's bits; the strict mode makes them deterministic
    and stops an op that has no deterministic kernel with torch's error naming it."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    try:
        runtime.deterministic_cuda()
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[2], before[3]
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[4], before[5]


def test_an_op_without_a_deterministic_kernel_is_one_line():
    """Under the strict mode torch refuses such an op with a RuntimeError; `zg` prints it as one line that names the
    op (zgdata.errors.from_nondeterministic, tried by zgtrain.cli.main). The refusal here is torch's own: `put_`
    has no deterministic kernel on any device."""
    from zgdata.errors import from_nondeterministic

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError) as e:
            torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    err = from_nondeterministic(e.value)
    assert err is not None and "no deterministic kernel for put_" in err.what and "ZG_DEVICE" in err.fix
    assert "\n" not in err.render()
    assert from_nondeterministic(RuntimeError("CUDA out of memory")) is None
    assert from_nondeterministic(ValueError("put_ does not have a deterministic implementation")) is None


def test_device_sets_up_cuda_determinism(monkeypatch):
    """`device()` for a CUDA name calls deterministic_cuda (recorded here; the CPU has no CUDA to set up)."""
    calls = []
    monkeypatch.setattr(runtime, "deterministic_cuda", lambda: calls.append(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(runtime.DEVICE_ENV, "cpu")
    assert runtime.device() == torch.device("cpu") and calls == []
    monkeypatch.setenv(runtime.DEVICE_ENV, "cuda")
    assert runtime.device() == torch.device("cuda") and calls == [1]


def test_cores_are_the_ones_this_process_may_use():
    """A child process narrowed to one core by its affinity (what taskset and a container's cpuset do), and one whose
    count is capped by LOKY_MAX_CPU_COUNT (joblib's count, which also reads the cgroup's CPU quota), each sees one."""
    import subprocess
    import sys

    from zgdata.core.runtime import cores

    assert 1 <= cores() <= len(os.sched_getaffinity(0))
    code = "from zgdata.core.runtime import cores; print(cores())"
    pin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
    env = {k: v for k, v in os.environ.items() if k != "LOKY_MAX_CPU_COUNT"}
    outs = [
        subprocess.run([sys.executable, "-c", c], env=e, capture_output=True, text=True, check=True).stdout.strip()
        for c, e in ((pin + code, env), (code, {**env, "LOKY_MAX_CPU_COUNT": "1"}), (code, env))
    ]
    assert outs == ["1", "1", str(cores())]  # unpinned and uncapped: what this process sees

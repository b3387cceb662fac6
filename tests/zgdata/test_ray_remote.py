"""zgdata.core.ray_cluster.remote: a task that holds a GPU runs in a worker process of its own, on the session's real
Ray cluster. A process keeps the CUDA device it first used, so a reused worker on a box of several GPUs would run its
next task on its old GPU; Ray makes GPU tasks single-use only when ``ray.remote`` itself is given ``num_gpus``, and
zg gives resources through ``.options()``."""

from __future__ import annotations


def test_a_gpu_task_gets_a_fresh_worker_process_each_time(ray_session):
    import ray

    from zgdata.core import ray_cluster

    def pid() -> int:
        import os

        return os.getpid()

    # this cluster has no GPU: the GPU task's rule, on a CPU's resources (the same options zg gives its tasks)
    opts = ray_cluster.task_options(cpus=1, gpus=0, name="zg-test-pid")
    single = ray_cluster.remote(pid, gpus=1).options(**opts)
    pids = [ray.get(single.remote()) for _ in range(3)]
    assert len(set(pids)) == 3, pids
    assert isinstance(ray.get(ray_cluster.remote(pid, gpus=0).options(**opts).remote()), int)  # a CPU task as before


def test_zgs_ray_tasks_are_made_by_ray_cluster_remote():
    """Every remote function zg makes from a plain function goes through ``ray_cluster.remote`` (an actor class may
    use the decorator: it holds no GPU). A bare ``ray.remote(fn)`` would bring back reused GPU workers."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bare = []
    for path in [*(root / "zgdata").rglob("*.py"), *(root / "zgtrain").rglob("*.py")]:
        if path.name == "ray_cluster.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "remote"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "ray"
                and node.args
            ):
                bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert bare == []

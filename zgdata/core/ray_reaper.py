"""The watcher that ends a local Ray instance with the driver that started it, however the driver dies.

A driver killed with SIGKILL runs no exit handler, and Ray's agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) can outlive its raylet for a long while. ``zgdata.core.ray_cluster.connect`` therefore
starts this module as a process of its own session (``python -m zgdata.core.ray_reaper DRIVER_PID``) before it
starts Ray, holding the write end of a pipe that is the watcher's stdin. While the driver lives, the watcher
records every descendant of it whose command line is Ray's (pid and start time, every ``POLL_S``); when the
pipe closes (the driver exited or died), it kills those that still run, after ``ray.shutdown`` on a normal
exit. Linux only (it reads /proc); elsewhere it records nothing. Standard library only, so it starts fast.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from pathlib import Path

__all__ = ["POLL_S", "ray_descendants", "main"]

POLL_S = 0.25


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ... starttime (22nd field)
    return int(fields[1]), int(fields[19])


def _is_ray(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return cmd.startswith(b"ray::") or b"/ray/" in cmd


def ray_descendants(root: int) -> dict[int, int]:
    """{pid: start time} of the Ray processes under process ``root`` (not this process)."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        if pid != os.getpid() and _is_ray(pid):
            out[pid] = stats[pid][1]
    return out


def main(driver: int) -> None:
    seen: dict[int, int] = {}
    proc = Path("/proc").is_dir()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if proc:
            seen.update(ray_descendants(driver))
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # the pipe closed: the driver is gone, or done with Ray
    for pid, start in seen.items():
        st = _stat(str(pid))
        if st is not None and st[1] == start:  # the very process recorded, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""Checkpoints outlive a power loss, not only a kill: a real tiny block trains in this process while os.fsync,
os.replace and shutil.rmtree are recorded. Every file of a checkpoint and its folder reach the disk before the
folder is renamed into place, the run folder's entry before meta.json points at it, meta.json before its rename,
and the run folder again before an older checkpoint is removed (zgtrain/fit/checkpoint.py ``save``)."""

from __future__ import annotations

import os
import shutil

from tests.helpers.projects import project_of
from zgdata.layout import Layout
from zgtrain.block.train import train_block


def test_a_checkpoint_is_on_the_disk_before_meta_json_points_at_it(tiny_project, monkeypatch):
    events: list[tuple[str, str]] = []
    fsync, replace, rmtree = os.fsync, os.replace, shutil.rmtree

    def spy_fsync(fd):
        events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def spy_replace(src, dst, *a, **kw):
        events.append(("replace", str(dst)))
        return replace(src, dst, *a, **kw)

    def spy_rmtree(path, *a, **kw):
        events.append(("rmtree", str(path)))
        return rmtree(path, *a, **kw)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    monkeypatch.setattr(shutil, "rmtree", spy_rmtree)
    r = train_block(project_of(tiny_project), "b00", layout=Layout(tiny_project))
    monkeypatch.undo()
    assert r.status == "done"

    d = str((tiny_project / "models" / "blocks" / "b00").resolve())
    at = {i: e for i, e in enumerate(events)}
    ckpts = [i for i, (k, p) in at.items() if k == "replace" and os.path.dirname(p) == d and "/ckpt-" in p]
    metas = [i for i, (k, p) in at.items() if k == "replace" and p == f"{d}/meta.json"]
    assert len(ckpts) >= 3 and len(metas) == len(ckpts)  # checkpoint 0, the periodic ones, the last
    for c, m in zip(ckpts, metas, strict=True):
        partial = f"{d}/.{os.path.basename(at[c][1])}.partial"
        synced = [p for k, p in (at[i] for i in range(c)) if k == "sync"]
        assert partial in synced and sum(p.startswith(partial + "/") for p in synced) >= 6, at[c]
        assert ("sync", d) in [at[i] for i in range(c + 1, m)], "the run folder was not synced before meta.json"
        assert ("sync", f"{d}/.meta.json.partial") in [at[i] for i in range(c, m)]
        removed = [i for i in range(m, len(events)) if at[i][0] == "rmtree" and "/ckpt-" in at[i][1]]
        if removed:  # the older checkpoint goes only once meta.json's rename is on the disk
            assert ("sync", d) in [at[i] for i in range(m + 1, removed[0])]

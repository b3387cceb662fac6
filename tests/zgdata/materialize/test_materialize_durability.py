"""Published boundaries outlive a power loss, not only a kill: materialize runs in this process while os.fsync and
os.replace are recorded. Every file of a boundary's publish folder (the compacted data files, the manifest) and
every folder in it reach the disk before the rename that publishes it, and data/boundaries/'s entries after the
renames (zgdata/materialize/staging.py ``finalize``)."""

from __future__ import annotations

import os
import shutil

import yaml

from zgdata.config import MaterializeConfig, PartitionConfig, section
from zgdata.layout import Layout
from zgdata.materialize.driver import materialize


def test_each_boundary_is_on_the_disk_before_its_rename_publishes_it(tiny_project, monkeypatch):
    params = yaml.safe_load((tiny_project / "params.yaml").read_text())
    cfg, part = section(params, MaterializeConfig, "materialize"), section(params, PartitionConfig, "partition")
    folder = tiny_project / "data" / "boundaries"
    shutil.rmtree(folder)
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd):
        events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def spy_replace(src, dst, *a, **kw):
        events.append(("replace", os.path.realpath(dst)))
        return replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    r = materialize(cfg, part, layout=Layout(tiny_project))
    monkeypatch.undo()
    assert not r.skipped and sorted(r.paths) == ["h00", "h02", "h04"]

    real = folder.resolve()
    published = []
    for n in sorted(r.paths):
        final = real / f"{n}.lance"
        at = [i for i, e in enumerate(events) if e == ("replace", str(final))]
        assert len(at) == 1, (n, events)
        published.append(at[0])
        synced = [p for k, p in events[: at[0]] if k == "sync"]
        pub = f"/{n}.publish.lance"
        files = sorted(p.relative_to(final) for p in final.rglob("*"))
        assert files and any(str(f).startswith("data/") for f in files), files
        for f in files:  # each file and folder, under the publish folder's name, before the rename
            assert any(s.endswith(f"{pub}/{f}") for s in synced), f"{n}: {f} was not synced before its rename"
        assert any(s.endswith(pub) for s in synced), f"{n}: the publish folder's entries were not synced"
    assert ("sync", str(real)) in events[max(published) + 1 :], "data/boundaries/ was not synced after the renames"

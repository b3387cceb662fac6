"""`zg init`'s DVC cache type cannot let an in-place edit corrupt the cache unseen (docs/SHARING.md).

With ``hardlink`` the workspace file is the cache object: an edit in place changes both, and `dvc status`
calls the project clean. ``reflink,copy`` gives the workspace its own bytes (a copy on ext4). Real `zg init`,
`dvc repro` (the session's ``reproduced`` project), a byte flipped in a Lance data file, real `dvc status`.
"""

from __future__ import annotations

import hashlib
import json

from tests.helpers.projects import copy_project
from tests.helpers.runners import run


def test_in_place_edit_after_repro_is_seen_by_dvc_status(reproduced, tmp_path):
    root = copy_project(reproduced, tmp_path / "proj")
    assert run(["dvc", "config", "cache.type"], cwd=root).stdout.strip() == "reflink,copy"
    run(["dvc", "checkout", "--relink"], cwd=root)  # the copy's files linked as the project's config says
    assert json.loads(run(["dvc", "status", "--json"], cwd=root).stdout or "{}") == {}
    data = sorted((root / "data" / "boundaries" / "h02.lance" / "data").glob("*.lance"))[0]
    assert data.stat().st_nlink == 1  # not a hardlink to the cache object
    cache = {hashlib.md5(p.read_bytes()).hexdigest() for p in (root / ".dvc" / "cache").rglob("*") if p.is_file()}
    data.chmod(0o644)
    with open(data, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    status = json.loads(run(["dvc", "status", "--json"], cwd=root).stdout or "{}")
    assert "materialize" in status, status
    # the cache objects are as they were: `dvc checkout` can restore the file
    assert {
        hashlib.md5(p.read_bytes()).hexdigest() for p in (root / ".dvc" / "cache").rglob("*") if p.is_file()
    } == cache
    run(["dvc", "checkout", "-f", "materialize"], cwd=root)
    assert json.loads(run(["dvc", "status", "--json"], cwd=root).stdout or "{}") == {}

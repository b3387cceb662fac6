"""Helpers shared by the zgdata tests (a plain module: no fixtures, nothing mocked)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import lance
import pyarrow as pa
import torch
import yaml
from conftest import BIN, read_json, tree_sha256  # noqa: F401 (re-exported)
from conftest import assert_user_error as _assert_user_error

from zgdata.store.lance_io import encode_meta, open_dataset, schema_meta, tensor_column

__all__ = [
    "edit_params",
    "boundary_bits",
    "assert_user_error",
    "tree_sha256",
    "set_schema_meta",
    "overwrite_table",
    "read_json",
    "kill_9_when",
]


def edit_params(root: Path, **sections) -> dict:
    """Merge ``sections`` ({"teacher": {"source": ...}}) into ROOT/params.yaml and write it back."""
    path = Path(root) / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for name, values in sections.items():
        params[name] = {**(params.get(name) or {}), **values}
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def boundary_bits(root: Path) -> dict[str, dict]:
    """Every complete boundary dataset of ROOT: fingerprint, seq_ids and the stored bits (int16 view for bf16)."""
    out = {}
    for path in sorted((Path(root) / "data" / "boundaries").glob("*.lance")):
        ds = open_dataset(path, kind="boundary")
        table = ds.to_table()
        x = tensor_column(table, "hidden", ds.schema.field("hidden"))
        bits = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        out[path.stem] = {
            "fingerprint": schema_meta(ds.schema)["fingerprint"],
            "bits": bits.clone(),
            "seq_id": torch.from_numpy(table.column("seq_id").to_numpy().copy()),
            "dtype": x.dtype,
        }
    return out


# The data commands fail before any progress output: their error line must be all of stderr.
assert_user_error = functools.partial(_assert_user_error, alone=True)


def set_schema_meta(path: Path, **updates) -> None:
    """Change ``zg.*`` schema metadata of a Lance dataset in place (a new Lance version), JSON-encoded."""
    ds = lance.dataset(str(path))
    ds.update_schema_metadata(encode_meta(updates))


def overwrite_table(path: Path, table: pa.Table) -> int:
    """Write ``table`` as a new version of the dataset at ``path``, keeping its schema and metadata."""
    ds = lance.dataset(str(path))
    table = pa.Table.from_arrays(table.columns, schema=ds.schema)
    return lance.write_dataset(table, str(path), mode="overwrite").version


def kill_9_when(ready, args: list[str], cwd: Path, env: dict, stderr_path: Path, what: str) -> subprocess.Popen:
    """Run ``zg ARGS`` in CWD and `kill -9` it as soon as ``ready()`` is true (polled while it runs).

    WHAT names the awaited event in the failure messages; the run's stderr goes to STDERR_PATH."""
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([str(BIN / "zg"), *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 600  # a hang guard, not a timing assertion
            while not ready():
                assert proc.poll() is None, f"zg exited ({proc.returncode}) before {what}: {stderr_path.read_text()}"
                assert time.monotonic() < deadline, f"gave up waiting for {what}"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc


def journal_rows(root: Path) -> int:
    """Rows a running materialize has committed so far (its staging journal; 0 before the first commit)."""
    best = 0
    for j in (root / "data" / ".staging").glob("*/journal.json"):
        try:
            best = max(best, json.loads(j.read_text())["rows_done"])
        except (OSError, ValueError, KeyError):
            pass  # not written yet
    return best

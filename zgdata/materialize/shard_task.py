"""One shard of a data-parallel materialize: capture rows [lo, hi) and write them as Lance fragments.

A plain function, no Ray here: zgdata/materialize/ray_shards.py runs it as a Ray task, and it runs the same
when called directly. It writes data files into each staged boundary dataset but commits
nothing; it returns the fragments' metadata, and the driver (zgdata/materialize/sharded.py)
commits them in row order (``staging.commit``). A killed attempt's files are therefore never part of a dataset
(the driver deletes such orphans before publishing). Argument and result are JSON text, so
no pickled data passes between processes.

The rows are captured in the same batches as a single-process run (shards start at multiples
of ``batch_size``), encoded by the same pool of threads in row order (zgdata/materialize/encode.py), each
boundary's record batches streamed to its own ``write_fragments`` call in a thread, so a shard's memory
is a few batches, not the whole shard, and its files hold the bytes a single-process run writes.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from pathlib import Path

import torch

from zgdata.capture_version import BOUNDARY_FORMAT_VERSION, CAPTURE_VERSION
from zgdata.core import host_copy
from zgdata.errors import ZgError, from_os_error
from zgdata.layout import Layout
from zgdata.materialize import stats as boundary_stats
from zgdata.materialize.encode import Encoder
from zgdata.materialize.forward import captured
from zgdata.materialize.staging import Streams, boundary_schema
from zgdata.store.codec import CODECS, FORMATS
from zgdata.store.integrity import CHECKSUMS

__all__ = ["run_shard", "VERSIONS"]

# a worker whose zg differs in any of these would write other bytes: the driver refuses it
VERSIONS = {
    "capture": CAPTURE_VERSION,
    "format": BOUNDARY_FORMAT_VERSION,
    "formats": list(FORMATS),
    "codecs": list(CODECS),
    "checksums": list(CHECKSUMS),
}
_TEACHER: dict = {}  # this worker process's teacher, kept for its next shard (CPU; a GPU task's process runs one)


def run_shard(spec_json: str) -> str:
    """Capture and write one shard; JSON in, JSON out. A user-fixable failure comes back as ``{"error": ...}``."""
    spec = json.loads(spec_json)
    try:
        return json.dumps(_run(spec))
    except ZgError as e:
        err = e
    except Exception as e:  # a full disk or a read-only staging dir: one line, like the single-process path
        err = from_os_error(e, Path(spec["stage"]))
        if err is None:
            raise
    return json.dumps(
        {
            "lo": spec["lo"],
            "hi": spec["hi"],
            "error": {"what": err.what, "fix": err.fix, "key": err.key, "code": err.code},
        }
    )


def _teacher(layout: Layout, dtype: str, sha: str):
    from zgdata.core.runtime import device
    from zgdata.teacher.prepare import load_teacher

    key = (str(layout.teacher_hf.resolve()), dtype, sha, str(device()))
    if key not in _TEACHER:
        _TEACHER.clear()  # one teacher per worker process
        _TEACHER[key], _ = load_teacher(layout, dtype=dtype, with_tokenizer=False, per_layer=True)
    return _TEACHER[key]


def _check(spec: dict, layout: Layout, stage: Path) -> None:
    from zgdata.lineage import read_tokens_json
    from zgdata.teacher.prepare import read_teacher_json

    if not stage.is_dir():
        raise ZgError(
            f"the shard worker on host {socket.gethostname()} cannot see the staging dir {stage}",
            fix="run every Ray node with the project on a shared filesystem at the same path, "
            "or set materialize.workers: 1",
        )
    if spec["versions"] != VERSIONS:
        raise ZgError(
            f"the shard worker on host {socket.gethostname()} runs another zg (capture/format versions "
            f"{VERSIONS}, the driver has {spec['versions']})",
            fix="install the same zg on every Ray node",
        )
    have = {
        "teacher_sha256": read_teacher_json(layout)["weights_sha256"],
        "tokens_fingerprint": read_tokens_json(layout)["fingerprint"],
    }
    for k, want in spec["expect"].items():
        if have[k] != want:
            raise ZgError(
                f"{k} changed while materialize ran ({str(want)[:12]} -> {str(have[k])[:12]})",
                fix="rerun `zg data materialize` when the teacher and tokens stay put",
            )


def _writers(spec: dict, stage: Path, schema, codec: str) -> tuple[Encoder, Streams]:
    """The shard's encoding pool and its Lance streams (one per boundary, with write-behind)."""
    encoder = Encoder(
        threads=spec.get("writer_threads", 1),
        schema=schema,
        storage_dtype=spec["storage_dtype"],
        codec=codec,
        checksum=spec.get("checksum", "blake2b"),  # a driver without the key predates format 4: blake2b
    )
    try:  # Ray may reuse this process for the next shard (CPU tasks): nothing of this one may outlive a failure
        rows = spec["hi"] - spec["lo"]
        return encoder, Streams(
            stage, spec["names"], schema, rows_per_file=rows, write_behind=spec.get("write_behind_mb", 0) << 20
        )
    except BaseException:
        encoder.close()
        raise


def _run(spec: dict) -> dict:
    from zgdata.core.runtime import set_device, set_threads

    t0, cpu0 = time.perf_counter(), time.process_time()
    set_threads(spec["threads"])
    if spec.get("device"):
        set_device(spec["device"])  # a joined cluster's workers do not inherit the driver's env
    layout, stage = Layout(Path(spec["root"])), Path(spec["stage"])
    _check(spec, layout, stage)
    model = _teacher(layout, spec["compute_dtype"], spec["expect"]["teacher_sha256"])
    names, layers, lo, hi = spec["names"], spec["layers"], spec["lo"], spec["hi"]
    storage = getattr(torch, spec["storage_dtype"])
    codec = spec.get("codec", "raw")
    schema = boundary_schema(None, spec["seq_len"], spec["hidden"], spec["storage_dtype"], codec)
    stats = {n: boundary_stats.empty() for n in names}
    encoder, streams = _writers(spec, stage, schema, codec)

    def stream(keep):
        for _, encoded in encoder.done(keep=keep):
            for n in names:
                stats[n] = boundary_stats.combine(stats[n], encoded[n].stats)
                streams.put(n, encoded[n].batch)

    try:
        try:
            for rows, splits, caps in captured(
                model, layout, lo=lo, hi=hi, batch_size=spec["batch_size"], layers=layers, storage=storage
            ):
                encoder.submit(rows, splits, {n: caps[layer] for n, layer in zip(names, layers)})
                stream(None)
            stream(0)
        except BaseException:
            streams.close(abort=True)
            raise
        finally:
            encoder.close()
        fragments = streams.close()
    finally:
        host_copy.release()  # a GPU shard's cached pinned buffers, all free now (Ray may run another shard here)
    _test_hooks(spec)
    return {
        "lo": lo,
        "hi": hi,
        "fragments": fragments,
        "stats": stats,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _test_hooks(spec: dict) -> None:
    """Test hooks from the spec: the driver reads ZG_TEST_SHARD_LOG / ZG_FAILPOINT_SLEEP_IN_SHARD (zgdata/core/failpoints.py).

    They travel in the spec because a joined cluster's workers do not inherit the driver's environment.

    After its fragments are written, each attempt appends ``{"lo", "hi", "pid", "driver"}`` to the log (the
    driver's pid tells a killed run's late task from its rerun's). With a
    sleep, the one attempt that first creates ``<log>.sleeper`` then sleeps: a window in which a test
    kills this worker with kill -9 (its retry, and every other shard, run straight through).
    """
    hooks = spec.get("hooks") or {}
    if not hooks.get("log"):
        return
    log = Path(hooks["log"])
    with open(log, "a") as f:  # one short write in append mode: lines of concurrent workers do not mix
        f.write(
            json.dumps({"lo": spec["lo"], "hi": spec["hi"], "pid": os.getpid(), "driver": hooks.get("driver")}) + "\n"
        )
    if hooks.get("sleep"):
        try:
            with open(f"{log}.sleeper", "x") as f:
                f.write(json.dumps({"lo": spec["lo"], "pid": os.getpid()}))
        except FileExistsError:
            return
        time.sleep(float(hooks["sleep"]))

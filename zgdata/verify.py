"""`zg data verify`: lineage, row alignment and a bit-exact recompute of sampled sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from zgdata.boundary import LINEAGE_KEYS, boundary_fingerprint
from zgdata.capture import capture
from zgdata.config import VerifyConfig
from zgdata.atomic import write_json
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.reader import BoundaryDataset

__all__ = ["verify"]

REMAT = "re-run `dvc repro -f materialize` (and bump CAPTURE_VERSION if capture semantics changed)"


def _open_all(folder: Path) -> list[BoundaryDataset]:
    paths = sorted(folder.glob("*.lance")) if folder.exists() else []
    if not paths:
        raise ZgError(f"no boundary datasets in {folder}",
                      fix="run `dvc repro materialize`, or `dvc pull` the boundaries you need")
    return [BoundaryDataset(p) for p in paths]


def _lineage_failures(sets: list[BoundaryDataset]) -> list[dict]:
    out = []
    ref = sets[0]
    for b in sets:
        lin = b.meta["lineage"]
        if boundary_fingerprint(lin) != b.fingerprint:
            out.append({"boundary": b.name, "check": "fingerprint",
                        "what": f"{b.name}'s fingerprint does not match its lineage", "fix": REMAT})
        for k in LINEAGE_KEYS:
            if lin.get(k) != ref.meta["lineage"].get(k):
                out.append({"boundary": b.name, "check": "lineage",
                            "what": f"{b.name} has {k}={str(lin.get(k))[:16]} but {ref.name} has "
                                    f"{str(ref.meta['lineage'].get(k))[:16]}", "fix": REMAT})
        if not np.array_equal(b.seq_ids, ref.seq_ids):
            out.append({"boundary": b.name, "check": "alignment",
                        "what": f"{b.name} rows are not aligned with {ref.name} by seq_id", "fix": REMAT})
    return out


def _recompute_failures(sets, cfg: VerifyConfig, sample: int, layout: Layout) -> tuple[list[dict], list[int], dict]:
    from zgdata.lance_io import open_dataset, schema_meta
    from zgdata.teacher import load_teacher_checked, read_teacher_json
    from zgdata.tokens import read_tokens

    lin = sets[0].meta["lineage"]
    teacher = read_teacher_json(layout)
    if teacher["weights_sha256"] != lin["teacher_sha256"]:
        return [{"boundary": "*", "check": "teacher", "what": f"boundaries come from teacher {lin['teacher_sha256'][:12]} "
                 f"but models/teacher is {teacher['weights_sha256'][:12]}", "fix": REMAT}], [], {}
    tok_ds = open_dataset(layout.tokens, kind="tokens")
    if schema_meta(tok_ds.schema)["fingerprint"] != lin["tokens_fingerprint"]:
        return [{"boundary": "*", "check": "tokens", "what": "boundaries were made from another token set than "
                 "data/tokens.lance", "fix": REMAT}], [], {}
    n = len(sets[0].seq_ids)
    g = torch.Generator().manual_seed(cfg.seed)
    rows = np.sort(torch.randperm(n, generator=g)[: min(sample, n)].numpy())
    # rehash: verify never trusts the digest cache that makes ordinary teacher loads cheap
    model, _, identity = load_teacher_checked(layout, dtype=lin["compute_dtype"], with_tokenizer=False, rehash=True)
    storage = getattr(torch, lin["storage_dtype"])
    failures = []
    for r in rows:
        ids, _ = read_tokens(layout, [int(sets[0].seq_ids[r])], ds=tok_ds)
        caps = capture(model, ids, [b.meta["layer"] for b in sets], storage_dtype=storage)
        for b in sets:
            stored = b.take([r])
            fresh = caps[b.meta["layer"]]
            if not torch.equal(stored.view(torch.int16) if storage == torch.bfloat16 else stored,
                               fresh.view(torch.int16) if storage == torch.bfloat16 else fresh):
                diff = int((stored.float() != fresh.float()).sum())
                failures.append({"boundary": b.name, "check": "recompute", "row": int(r), "seq_id": int(b.seq_ids[r]),
                                 "what": f"{b.name} row {r} (seq_id {int(b.seq_ids[r])}): {diff} values differ from "
                                         f"a fresh teacher pass", "fix": REMAT})
    return failures, [int(sets[0].seq_ids[r]) for r in rows], identity


def verify(cfg: VerifyConfig, *, sample: int | None = None, lineage_only: bool = False, layout: Layout = Layout(),
           boundaries_dir: Path | None = None) -> dict:
    folder = Path(boundaries_dir) if boundaries_dir else layout.boundaries_dir
    sets = _open_all(folder)
    failures = _lineage_failures(sets)
    checked, identity = [], {}
    if not lineage_only and not failures:
        more, checked, identity = _recompute_failures(sets, cfg, cfg.sample if sample is None else sample, layout)
        failures += more
    report = {
        "status": "ok" if not failures else "fail",
        "summary": (f"{len(sets)} boundaries, lineage and alignment ok" + ("" if lineage_only else
                    f", {len(checked)} sequences bit-identical, {identity.get('hashed', 0)} teacher files rehashed"))
                   if not failures else
                   "; ".join(f["what"] for f in failures[:3]) + (f" (+{len(failures) - 3} more)" if len(failures) > 3 else "")
                   + ". " + failures[0]["fix"],
        "lineage_only": lineage_only,
        "boundaries": {b.name: {"fingerprint": b.fingerprint, "rows": len(b.seq_ids), "version": b.ds.version,
                                "layer": b.meta["layer"]} for b in sets},
        "lineage": {k: sets[0].meta["lineage"].get(k) for k in LINEAGE_KEYS},
        "checked_seq_ids": checked,
        "teacher_files": identity,
        "failures": failures,
    }
    write_json(layout.verify_report, report)
    return report

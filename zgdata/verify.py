"""`zg data verify`: lineage, row alignment, every row's checksum and a bit-exact recompute of sampled sequences."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from zgdata.config import MaterializeConfig, PartitionConfig, VerifyConfig
from zgdata.core.atomic import write_json
from zgdata.errors import ZgError, dvc_pull
from zgdata.families.capture import capture_rows
from zgdata.layout import Layout
from zgdata.lineage import LINEAGE_KEYS, boundary_fingerprint, mismatch_text, mismatches
from zgdata.store.integrity import recover_fix
from zgdata.store.quant import roundtrip_tensor
from zgdata.store.reader import BoundaryDataset

__all__ = ["verify"]

REMAT = "re-run `dvc repro -f materialize` (and bump CAPTURE_VERSION if capture semantics changed)"


def _open_all(folder: Path) -> list[BoundaryDataset]:
    paths = sorted(folder.glob("*.lance")) if folder.exists() else []
    if not paths:
        raise ZgError(
            f"no boundary datasets in {folder}",
            fix="run `dvc repro materialize`, or `dvc pull` the boundaries you need",
        )
    return [BoundaryDataset(p) for p in paths]


def _lineage_failures(sets: list[BoundaryDataset]) -> list[dict]:
    out = []
    ref = sets[0]
    for b in sets:
        lin = b.meta["lineage"]
        if boundary_fingerprint(lin) != b.fingerprint:
            out.append(
                {
                    "boundary": b.name,
                    "check": "fingerprint",
                    "what": f"{b.name}'s fingerprint does not match its lineage",
                    "fix": REMAT,
                }
            )
        for k, mine, theirs in mismatches(lin, ref.meta["lineage"]):
            out.append(
                {
                    "boundary": b.name,
                    "check": "lineage",
                    "what": mismatch_text(k, b.name, mine, ref.name, theirs),
                    "fix": REMAT,
                }
            )
        if not np.array_equal(b.seq_ids, ref.seq_ids):
            out.append(
                {
                    "boundary": b.name,
                    "check": "alignment",
                    "what": f"{b.name} rows are not aligned with {ref.name} by seq_id",
                    "fix": REMAT,
                }
            )
    return out


def _missing(folder: Path, partition: PartitionConfig | None) -> list[str]:
    """Boundaries that partition.boundaries needs but ``folder`` lacks."""
    return [n for n in (partition.names if partition else []) if not (folder / f"{n}.lance").exists()]


def _checksum_failures(sets: list[BoundaryDataset], *, listed: int = 10) -> tuple[list[dict], dict[str, int]]:
    """Every row of every boundary against its checksum, streamed; the first ``listed`` bad rows each get an entry."""
    out, counts = [], {}
    for b in sets:
        counts[b.name], bad = b.scan()
        for row, seq_id in bad[:listed]:
            out.append(
                {
                    "boundary": b.name,
                    "check": "checksum",
                    "row": row,
                    "seq_id": seq_id,
                    "what": f"{b.name} row {row} (seq_id {seq_id}): stored hidden states do not match the "
                    f"checksum written at materialize",
                    "fix": recover_fix(b.path),
                }
            )
        if len(bad) > listed:
            out.append(
                {
                    "boundary": b.name,
                    "check": "checksum",
                    "rows": len(bad),
                    "what": f"{b.name}: {len(bad) - listed} more rows fail their checksum",
                    "fix": recover_fix(b.path),
                }
            )
    return out, counts


def _recompute_failures(
    sets, cfg: VerifyConfig, sample: int, layout: Layout, batch: int
) -> tuple[list[dict], list[int], dict]:
    from zgdata.lineage import read_tokens_json
    from zgdata.teacher.prepare import load_teacher_checked, read_teacher_json
    from zgdata.tokens.store import open_tokens, read_tokens

    lin = sets[0].meta["lineage"]
    teacher, tokens = read_teacher_json(layout), read_tokens_json(layout)
    here = {
        "teacher_sha256": teacher["weights_sha256"],
        "tokenizer_sha256": teacher["tokenizer_sha256"],
        "tokens_fingerprint": tokens["fingerprint"],
    }
    bad = mismatches(lin, here, keys=here)
    if bad:
        return (
            [
                {
                    "boundary": "*",
                    "check": "tokens" if k == "tokens_fingerprint" else "teacher",
                    "what": mismatch_text(k, "the boundaries", a, "models/teacher + data/tokens.json", b),
                    "fix": REMAT,
                }
                for k, a, b in bad
            ],
            [],
            {},
        )
    tok_ds = open_tokens(layout)
    n = len(sets[0].seq_ids)
    g = torch.Generator().manual_seed(cfg.seed)
    rows = np.sort(torch.randperm(n, generator=g)[: min(sample, n)].numpy())
    # rehash: verify never trusts the digest cache that makes ordinary teacher loads cheap
    model, _, identity = load_teacher_checked(
        layout, dtype=lin["compute_dtype"], with_tokenizer=False, rehash=True, per_layer=True
    )
    storage = getattr(torch, lin["storage_dtype"])
    layers = [b.meta["layer"] for b in sets]
    failures = []
    for lo in range(0, len(rows), batch):  # in forwards of materialize's row count, as it captured them
        chunk = rows[lo : lo + batch]
        ids, _ = read_tokens(layout, [int(sets[0].seq_ids[r]) for r in chunk], ds=tok_ds)
        caps = capture_rows(model, ids, layers, storage_dtype=storage, rows=batch)
        for j, r in enumerate(chunk):
            failures += _row_failures(sets, r, {layer: caps[layer][j : j + 1] for layer in layers}, storage)
    return failures, [int(sets[0].seq_ids[r]) for r in rows], identity


def _row_failures(sets, r, caps: dict, storage) -> list[dict]:
    """Row ``r`` of each boundary in ``sets`` against ``caps`` ({layer: its fresh capture}), bit for bit."""
    failures = []
    for b in sets:
        stored = b.take([r], check=False)  # checksums were checked above; report, don't raise
        fresh = roundtrip_tensor(caps[b.meta["layer"]], _values_codec(b))  # a quantized codec's stored values
        if not torch.equal(
            stored.view(torch.int16) if storage == torch.bfloat16 else stored,
            fresh.view(torch.int16) if storage == torch.bfloat16 else fresh,
        ):
            diff = int((stored.float() != fresh.float()).sum())
            failures.append(
                {
                    "boundary": b.name,
                    "check": "recompute",
                    "row": int(r),
                    "seq_id": int(b.seq_ids[r]),
                    "what": f"{b.name} row {r} (seq_id {int(b.seq_ids[r])}): {diff} values differ from "
                    f"a fresh teacher pass",
                    "fix": REMAT,
                }
            )
    return failures


def _values_codec(b) -> str:
    """The codec whose values ``b`` holds: a stored boundary's own; a virtual h00's is materialize.codec (its codec
    is "virtual", but it quantizes as a stored h00 would: zgdata/materialize/virtual.py)."""
    return getattr(b, "quant", None) or b.codec


def _virtual(layout: Layout, partition, mcfg, lineage_only: bool) -> tuple[list, list[str]]:
    """(virtual boundaries, the names of those that cannot be computed here) under materialize.virtual_first."""
    from zgdata.materialize.virtual import VirtualBoundary, is_virtual

    names = [n for n in partition.names if is_virtual(n, partition, mcfg)] if partition and mcfg else []
    if lineage_only and not (layout.tokens.exists() and layout.teacher_head.exists()):
        return [], names  # a subset was pulled: listed as not present, as a stored one would be
    return [VirtualBoundary(layout, mcfg, n) for n in names], []


def _trust_failures(full: bool) -> tuple[list[dict], dict | None]:
    """With ``full``: every output dvc.lock (git) records, present here, against its md5 (zgdata/trust/dvc_lock.py)."""
    if not full:
        return [], None
    from zgdata.trust import dvc_lock as trust

    try:
        c = trust.verify_all(Path("."))
    except ZgError as e:
        return [{"boundary": "*", "check": "dvc.lock", "what": e.what, "fix": e.fix or ""}], None
    return [], {"outputs": c.outputs, "hashed": c.hashed, "cached": c.cached}


def _missing_failures(missing: list[str], folder: Path) -> list[dict]:
    return [
        {
            "boundary": n,
            "check": "missing",
            "what": f"{n} ({folder / f'{n}.lance'}), which partition.boundaries needs, is missing",
            "fix": f"`{dvc_pull(folder / f'{n}.lance')}`, or re-create it with `dvc repro materialize`",
        }
        for n in missing
    ]


def _summary(sets, virtual, summed, checked, identity, missing, trusted, lineage_only, failures) -> str:
    """The report's one line: what was checked, or the first failures and the fix of the first."""
    if failures:
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        return "; ".join(f["what"] for f in failures[:3]) + more + ". " + failures[0]["fix"]
    line = f"{len(sets)} boundaries"
    if virtual:
        line += f" ({', '.join(sorted(b.name for b in virtual))} virtual)"
    line += f", lineage and alignment ok, {sum(summed.values())} rows' checksums ok"
    if not lineage_only:
        line += f", {len(checked)} sequences bit-identical, {identity.get('hashed', 0)} teacher files rehashed"
    if missing:
        line += f"; not present: {', '.join(missing)}"
    if trusted:
        line += (
            f"; dvc.lock: {trusted['outputs']} outputs match ({trusted['hashed']} files hashed, "
            f"{trusted['cached']} from the cache)"
        )
    return line


def _boundary_rows(sets, summed: dict) -> dict:
    return {
        b.name: {
            "fingerprint": b.fingerprint,
            "rows": len(b.seq_ids),
            "version": b.ds.version if b.ds is not None else None,
            "layer": b.meta["layer"],
            "checksum_rows": summed[b.name],
            **({"virtual": True} if b.ds is None else {}),
        }
        for b in sets
    }


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """What `zg data verify` found; ``metrics()`` is reports/verify.json."""

    status: str
    """ok, or fail (then ``failures`` says what and the fix)."""
    summary: str
    """One line: what was checked, or the first failures and the fix of the first."""
    lineage_only: bool
    trust: dict | None
    """With --full: outputs of dvc.lock and .dvc files checked, files hashed, hashes from the cache."""
    boundaries: dict
    """Per boundary: fingerprint, rows, Lance version, layer, rows whose checksum was checked."""
    checksum_rows_checked: int
    missing: list
    """Boundaries partition.boundaries needs that are not here."""
    lineage: dict
    checked_seq_ids: list
    """Sequences recomputed with the teacher and found bit-identical."""
    teacher_files: dict
    failures: list

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metrics(self) -> dict:
        return asdict(self)


def verify(
    cfg: VerifyConfig,
    *,
    sample: int | None = None,
    lineage_only: bool = False,
    layout: Layout = Layout(),
    boundaries_dir: Path | None = None,
    partition: PartitionConfig | None = None,
    mcfg=None,
    full: bool = False,
) -> VerifyResult:
    """``partition``: the boundaries the project needs. A missing one fails the full verify (the DVC stage
    depends on all of them); ``lineage_only`` lists it without failing, since a team that pulled one
    block's pair runs that mode on a subset. ``mcfg`` (materialize): its batch_size is the row count of the
    recompute's forwards, as materialize ran them (default: the default's); with virtual_first, h00 is computed
    from the tokens and the head slice (zgdata/materialize/virtual.py); its lineage and alignment are checked and
    the sample is recomputed with the teacher like a stored boundary's (it has no checksums: nothing is stored).
    ``full``: first check every output dvc.lock records against its md5 (the counts go to the report's
    ``trust``)."""
    trust_failures, trusted = _trust_failures(full)
    folder = Path(boundaries_dir) if boundaries_dir else layout.boundaries_dir
    virtual, unbuilt = _virtual(layout, partition, mcfg, lineage_only) if boundaries_dir is None else ([], [])
    vnames = {b.name for b in virtual} | set(unbuilt)
    missing = [n for n in _missing(folder, partition) if n not in vnames] + unbuilt
    stored = [b for b in _open_all(folder) if b.name not in vnames]  # a stale stored h00 is not what readers use
    sets = sorted(stored + virtual, key=lambda b: b.meta["layer"])
    failures = [] if lineage_only else _missing_failures(missing, folder)
    lineage_failures = _lineage_failures(sets)
    sums, summed = _checksum_failures(stored)
    summed.update({b.name: 0 for b in virtual})
    failures += trust_failures + lineage_failures + sums
    checked, identity = [], {}
    if not lineage_only and not lineage_failures:
        n = cfg.sample if sample is None else sample
        batch = (mcfg or MaterializeConfig()).batch_size
        more, checked, identity = _recompute_failures(sets, cfg, n, layout, batch)
        failures += more
    result = VerifyResult(
        status="ok" if not failures else "fail",
        summary=_summary(sets, virtual, summed, checked, identity, missing, trusted, lineage_only, failures),
        lineage_only=lineage_only,
        trust=trusted,
        boundaries=_boundary_rows(sets, summed),
        checksum_rows_checked=sum(summed.values()),
        missing=missing,
        lineage={k: sets[0].meta["lineage"].get(k) for k in LINEAGE_KEYS}
        | ({"codec": sets[0].meta["lineage"]["codec"]} if "codec" in sets[0].meta["lineage"] else {}),
        checked_seq_ids=checked,
        teacher_files=identity,
        failures=failures,
    )
    # the verify stage's check writes its tracked report; a narrower one (a team's partial pull) its own
    partial = lineage_only or boundaries_dir is not None
    write_json(layout.partial_verify_report if partial else layout.verify_report, result.metrics())
    return result

"""`zg data inspect`: what a token or boundary dataset is, where it came from, and its versions."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from zgdata.errors import ZgError
from zgdata.store.codec import codec_of, value_info
from zgdata.store.integrity import checksum_of
from zgdata.store.lance_io import dir_bytes, open_dataset, schema_meta, version_rows
from zgdata.store.quant import is_quantized
from zgdata.trust import dvc_added
from zgdata.trust.dvc_lock import lock_stages

__all__ = ["collect", "describe_dataset", "provenance", "render"]


def provenance(path: Path) -> dict:
    """How DVC tracks ``path``: the producing stage, a .dvc file, or a `dvc import` source.

    ``path`` is the dataset's path relative to the DVC project root (the folder holding
    ``.dvc/``); ``tracked_by`` is the dvc.lock or .dvc file (also relative to the root) that
    records it, for the dataset itself or for a folder above it. A `dvc import` adds
    ``import`` with the source repository's url, the path inside it and the pinned commit; a
    `dvc import-url` adds ``import`` with the source url.
    """
    path = Path(path).resolve()
    root = next((p for p in (path, *path.parents) if (p / ".dvc").is_dir()), None)
    if root is None:
        return {"tracked_by": None}
    rel = path.relative_to(root).as_posix()
    for p in (path, *path.parents):
        if p == root:
            break
        dvc_file = p.with_name(p.name + ".dvc")
        if not dvc_file.is_file():
            continue
        name = dvc_file.relative_to(root).as_posix()
        spec = dvc_added.parse(dvc_added.read_text(dvc_file, name), name)
        out = {"tracked_by": name, "path": rel}
        dep = (spec.get("deps") or [{}])[0]
        sub = path.relative_to(p).as_posix()
        inner = dep.get("path") if sub == "." or not dep.get("path") else f"{dep['path']}/{sub}"
        repo = dep.get("repo")
        if isinstance(repo, dict):
            out["import"] = {
                "url": repo.get("url"),
                "path": inner,
                "rev": repo.get("rev"),
                "rev_lock": repo.get("rev_lock"),
            }
        elif dep.get("path"):  # dvc import-url
            out["import"] = {"url": inner, "path": None, "rev": None, "rev_lock": None}
        return out
    for name, st in lock_stages(root).items():
        for o in st.get("outs") or []:
            op = str(o.get("path", "")).rstrip("/")
            if op and (rel == op or rel.startswith(op + "/")):
                return {"tracked_by": "dvc.lock", "stage": name, "path": rel}
    return {"tracked_by": None, "path": rel}


def describe_dataset(path: Path, *, version: int | None = None) -> dict:
    ds = open_dataset(path, version=version, require_complete=False)
    meta = schema_meta(ds.schema)
    kind = meta.get("kind")
    if kind not in ("tokens", "boundary"):
        raise ZgError(
            f"{path} is a Lance dataset but not one ZeroGraph wrote (no zg.kind metadata)",
            fix="inspect data/tokens.lance or data/boundaries/",
        )
    splits = ds.to_table(columns=["split"]).column("split").to_numpy(zero_copy_only=False)
    names, counts = np.unique(splits, return_counts=True)
    info = {
        "codec": None,
        "path": str(path),
        "name": meta.get("name", Path(path).stem),
        "kind": kind,
        "version": ds.version,
        "rows": {str(k): int(v) for k, v in zip(names, counts)},
        "complete": meta.get("complete") is True,
        "bytes": dir_bytes(path),
        "fingerprint": meta.get("fingerprint"),
        "lineage": meta.get("lineage", {}),
        "versions": version_rows(ds),
        "source": provenance(path),
    }
    if kind == "boundary":
        dtype, seq_len, hidden = value_info(ds.schema, meta)
        info.update(
            layer=meta["layer"],
            seq_len=seq_len,
            hidden=hidden,
            dtype=dtype,
            format_version=meta.get("format_version"),
            codec=codec_of(meta),
            checksum=checksum_of(meta),  # the row checksum's algorithm (blake2b before boundary format 4)
            stats=meta.get("stats", {}),
            software=meta.get("software", {}),
        )
        if is_quantized(info["codec"]):  # lossy: its scheme, and its error measured against the teacher at write
            info.update(codec_params=meta.get("codec"), quant_error=info["stats"].get("quant_error"))
    else:
        info.update(layer=None, seq_len=meta["lineage"]["seq_len"], hidden=None, dtype="int32", stats={})
    return info


def describe_virtual(vb) -> dict:
    """A virtual boundary (materialize.virtual_first, zgdata/materialize/virtual.py): nothing stored, computed on read."""
    return {
        "codec": "virtual",
        "path": str(vb.path),
        "name": vb.name,
        "kind": "boundary",
        "version": None,
        "rows": dict(vb.meta["rows"]),
        "complete": True,
        "bytes": 0,
        "fingerprint": vb.fingerprint,
        "lineage": vb.meta["lineage"],
        "versions": [],
        "layer": 0,
        "seq_len": vb.seq_len,
        "hidden": vb.hidden,
        "dtype": vb.dtype,
        "format_version": None,
        "checksum": None,
        "stats": {},
        "software": {},
        "virtual": True,
        "source": {
            "tracked_by": None,
            "virtual": " + ".join(vb.meta["lineage"]["computed_from"])
            + f" (embedding {vb.meta['lineage']['embedding_sha256'][:12]})",
        },
    }


def collect(paths: list[Path], *, version: int | None = None) -> list[dict]:
    from zgdata.materialize.virtual import virtual_from_params

    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            vb = virtual_from_params(p)  # data/boundaries/h00.lance of a project whose h00 is virtual
            if vb is not None:
                out.append(describe_virtual(vb))
                continue
            raise ZgError(f"{p} does not exist", fix="run `dvc repro` (or `dvc pull`) first, or give another path")
        if p.suffix == ".lance" or (p / "_versions").exists():
            out.append(describe_dataset(p, version=version))
        else:
            vb = virtual_from_params(p / "h00.lance")  # the folder of a project whose h00 is virtual: it comes first
            found = [x for x in sorted(p.glob("*.lance")) if vb is None or x.name != "h00.lance"]
            if not found and vb is None:
                raise ZgError(f"{p} holds no .lance dataset", fix="give a dataset path or data/boundaries")
            out.extend(
                ([describe_virtual(vb)] if vb is not None else [])
                + [describe_dataset(x, version=version) for x in found]
            )
    return out


def _short(x) -> str:
    return str(x)[:12] if x else "-"


def _where(i: dict) -> str:
    src = i["source"]
    return (
        f"virtual: {src['virtual']}"
        if src.get("virtual")
        else f"import {src['import']['url']}"
        if src.get("import")
        else f"stage {src['stage']}"
        if src.get("stage")
        else src.get("tracked_by") or "untracked"
    )


def _history(i: dict) -> str:
    """One line: how many versions, and when the last one was written (the full list: --versions)."""
    if i.get("virtual"):
        return "computed on read"
    vs = i["versions"]
    return f"{len(vs)}, last {str(vs[-1]['timestamp']).replace('T', ' ')[:16]}" if vs else "-"


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _table(title: str, cols: tuple[str, ...], rows: list[dict], keep: tuple[str, ...]) -> Table:
    """A table with one space between columns. ``keep`` columns (names, hash prefixes, sizes) never wrap or
    shrink below their header; the others wrap at spaces, and fold a long word rather than cut it."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_lines=False)
    for col in cols:
        t.add_column(col, no_wrap=col in keep, overflow="fold", min_width=len(col))
    for r in rows:
        t.add_row(*(r[c] for c in cols))
    return t


def _codec_cell(i: dict) -> str:
    """The codec; a quantized one with its measured relative RMS error (``e=``)."""
    e = i.get("quant_error")
    return f"{i['codec']} e={e['rel_rms']:.1e}" if e else (i["codec"] or "-")


def _stats_cell(st: dict) -> str:
    if not st:
        return "-"
    out = f"rms {st['mean_rms']:.3g} max {st['absmax']:.3g}"
    e = st.get("quant_error")
    if e:  # relative RMS error over the boundary, and its worst channel's
        out += f" err {e['rel_rms']:.1e} ch{e['worst_channel']} {e['worst_channel_rel_rms']:.1e}"
    return out


def _cells(i: dict) -> dict:
    lin = i["lineage"]
    return {
        "name": i["name"],
        "layer": str(i["layer"] if i["layer"] is not None else "-"),
        "rows": " ".join(f"{k}={v}" for k, v in sorted(i["rows"].items())),
        "seq_len": str(i["seq_len"]),
        "hidden": str(i["hidden"] or "-"),
        "dtype": i["dtype"],
        "codec": _codec_cell(i),
        "checksum": i.get("checksum") or "-",
        "size": _size(i["bytes"]),
        "fingerprint": _short(i["fingerprint"]),
        "teacher": _short(lin.get("teacher_sha256")),
        "tokenizer": _short(lin.get("tokenizer_sha256")),
        "tokens": _short(lin.get("tokens_fingerprint") if i["kind"] == "boundary" else lin.get("corpus_digest")),
        "stats": _stats_cell(i["stats"]),
        "complete": "yes" if i["complete"] else "NO",
        "source": _where(i),
        "history": _history(i),
    }


PIPE_WIDTH = 240  # columns of the tables when the output is piped


def render(infos: list[dict], console: Console | None = None, *, wide: bool = False, versions: bool = False) -> None:
    """The datasets as tables that fit a terminal of 80 columns. Default: one row per dataset (name, layer, rows,
    codec, size, fingerprint prefix, complete, one line of history). ``wide`` adds the lineage table (teacher, tokenizer and
    token-set prefixes, where it comes from) and the storage table (shape, dtype, stats); ``versions`` each
    dataset's full version list. Hash cells are 12-character prefixes, never cut (full values: --json).
    Piped (stdout not a terminal, no COLUMNS), the tables are as wide as their cells, up to ``PIPE_WIDTH``: a
    dataset's row stays on one line for grep and the like, where rich would wrap it at 80 columns."""
    console = console or Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH)
    rows = [_cells(i) for i in infos]
    console.print(
        _table(
            "ZeroGraph datasets",
            ("name", "layer", "rows", "codec", "size", "fingerprint", "complete", "history"),
            rows,
            keep=("name", "fingerprint", "size"),
        )
    )
    if wide:
        console.print(
            _table(
                "lineage",
                ("name", "fingerprint", "teacher", "tokenizer", "tokens", "source"),
                rows,
                keep=("name", "fingerprint", "teacher", "tokenizer", "tokens"),
            )
        )
        console.print(
            _table(
                "storage", ("name", "seq_len", "hidden", "dtype", "codec", "checksum", "stats"), rows, keep=("name",)
            )
        )
    if not versions:
        return
    for i in infos:
        if i.get("virtual"):  # nothing stored, so no versions
            continue
        console.print(
            _table(
                f"{i['name']} versions",
                ("version", "timestamp", "rows", "message"),
                [
                    {
                        "version": str(r["version"]),
                        "timestamp": str(r["timestamp"]),
                        "rows": str(r["rows"]),
                        "message": r["message"],
                    }
                    for r in i["versions"]
                ],
                keep=("version", "timestamp"),
            )
        )

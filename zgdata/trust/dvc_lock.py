"""The git lineage is the root of trust: check DVC-tracked inputs against ``dvc.lock`` before a stage reads them.

Per-row checksums stored beside the data catch accidents (a torn write, a flipped bit on disk), but whoever can
write the data can rewrite them too. ``dvc.lock`` lives in git: it records the md5 of every stage output, and a
directory output's md5 is that of its ``.dir`` file list (each file's md5 and path, serialized as DVC does), which
zg recomputes from the files themselves (less what ``.dvcignore`` hides from DVC, such as a student folder's
model card): no cache needed. A DVC remote that serves other bytes, or another file
list, cannot change what git recorded, and DVC itself does not refuse such a pull. So before a stage reads a tracked input, ``verify`` hashes it (or takes the hash from a cache
keyed by inode, size, modification and change time, kept in ``.zg/trust.json``, each entry sealed with this user's
key from outside the project: ``state_key``) and compares it with ``dvc.lock``.
Hashing runs at disk speed: DVC records md5, and one file's md5 is a chain over its bytes that cannot be split
across cores, so ``verify`` hashes the files of every output it checks at once on a pool of threads (hashlib and
file reads release the GIL), as many as the cores, before it compares. A boundary pair (two datasets of one
large data file each) then hashes in about half the time on two cores (bench/write_path.py).
Files added with ``dvc add`` (a corpus, an eval set) are checked the same way against the ``.dvc`` file beside them
(``corpus.dvc`` for ``corpus/``) as git's HEAD has it (``zgdata/trust/dvc_added.py``).

A path that neither ``dvc.lock`` nor a ``.dvc`` file records (a project run without DVC, a file git tracks itself, a
test fixture) is not checked: there is nothing to check it against. A recorded path whose bytes differ is refused
with one line naming the file and what to do.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

from zgdata.core.paths_guard import inside
from zgdata.core.runtime import cores
from zgdata.errors import ZgError, dvc_checkout, dvc_pull
from zgdata.layout import Layout
from zgdata.trust import dvc_added, state_key

__all__ = ["verify", "verify_all", "recorded", "lock_stages", "cache_object", "file_md5", "Checked", "STATE"]

STATE = Layout(Path(".")).trust_cache  # relative to a project root
_CHUNK = 1 << 22
_MEMO: dict[tuple, str] = {}  # (path, inode, size, mtime_ns) -> md5, for this process


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What ``verify_all`` looked at: files hashed now, files whose hash came from the stat-keyed cache."""

    outputs: int
    hashed: int
    cached: int


def _project_root(path: Path) -> Path | None:
    """The nearest folder holding the path that is a DVC project: its dvc.yaml, dvc.lock or .dvc/ (a repository
    that only `dvc import`s or `dvc add`s has no dvc.yaml, and its ``.dvc`` files are still git's record)."""
    for d in [path, *path.parents]:
        if (d / "dvc.yaml").is_file() or (d / "dvc.lock").is_file() or (d / ".dvc").is_dir():
            return d
    return None


def lock_stages(root: Path) -> dict[str, dict]:
    """The stages ``root/dvc.lock`` records ({} without one), each a mapping whose ``outs`` and ``deps`` are lists of
    entries; a dvc.lock of another shape, or not YAML, is one line (``dvc_added.parse``)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    stages = dvc_added.parse(dvc_added.read_text(lock, "dvc.lock"), "dvc.lock", lists=()).get("stages") or {}
    if not isinstance(stages, dict):
        raise ZgError(
            "dvc.lock is not what DVC writes: its stages are not a mapping",
            fix="restore it from git (`git checkout dvc.lock`)",
        )
    return {name: dvc_added.entry(st, f"dvc.lock's stage {name}", "dvc.lock") for name, st in stages.items()}


def recorded(root: Path) -> dict[str, str]:
    """Every output ``root/dvc.lock`` records: its path (relative to root) -> md5 (``....dir`` for a directory)."""
    out = {}
    for stage in lock_stages(root).values():
        for o in stage.get("outs") or []:
            if o.get("path") and o.get("md5"):
                out[os.path.normpath(o["path"])] = str(o["md5"])
    return out


def _cache_dir(root: Path) -> Path:
    """The DVC cache (``cache.dir`` of .dvc/config.local or .dvc/config, else .dvc/cache)."""
    import configparser

    for name in ("config.local", "config"):
        cfg = configparser.ConfigParser()
        try:
            cfg.read(root / ".dvc" / name)
        except configparser.Error:
            continue
        d = cfg.get("cache", "dir", fallback=None)
        if d:
            d = d.strip().strip("'\"")
            return (root / ".dvc" / d).resolve() if not os.path.isabs(d) else Path(d)
    return root / ".dvc" / "cache"


def cache_object(root: Path, md5: str) -> Path:
    """Where ROOT's DVC cache keeps the object of ``md5`` (``....dir``: a directory's file list)."""
    return _cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]


def file_md5(path: Path) -> str:
    """The md5 of a file, as DVC records it."""
    h = hashlib.md5()
    with open(path, "rb", buffering=0) as f:  # unbuffered: each 4 MiB read lands straight in the hash's input
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamped_md5(path: Path) -> tuple[list[int], str]:
    """(the file's stat, taken before the read; its md5). A change while or after it is read shows in a later stat:
    the pair may be trusted, and sealed into the cache, only while the file's stat is still this one."""
    return _stat(path), file_md5(path)


def _stamped_md5s(paths, *, threads: int | None = None) -> dict[Path, tuple[list[int], str]]:
    """``_stamped_md5`` of each file, the files hashed at once on ``threads`` threads (default: the cores). One
    file's md5 is sequential by definition, so a single file hashes on one core whatever the count."""
    paths = list(dict.fromkeys(Path(p) for p in paths))
    n = min(len(paths), threads or cores())
    if n <= 1:
        return {p: _stamped_md5(p) for p in paths}
    from concurrent.futures import ThreadPoolExecutor

    # largest first, so that one big file does not start last and run alone
    order = sorted(paths, key=lambda p: -p.stat().st_size)
    with ThreadPoolExecutor(n, thread_name_prefix="zg-md5") as pool:
        return dict(zip(order, pool.map(_stamped_md5, order)))


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]  # ctime: an edit that restores mtime still shows


def _known(path: Path, state: dict) -> str | None:
    """The md5 of ``path`` from this process's memo or the sealed stat-keyed cache, if either holds it."""
    stat = _stat(path)
    key = (str(path), *stat)
    if key in _MEMO:
        return _MEMO[key]
    hit, k = state.get(str(path)), state_key.key()
    # only an entry this user's key sealed: a forged one (a poisoned file's stat and the recorded md5) is ignored
    if (
        k
        and hit
        and len(hit) == 6
        and hit[:4] == stat
        and hmac.compare_digest(hit[5], state_key.seal(k, str(path), stat, hit[4]))
    ):
        _MEMO[key] = hit[4]
        return hit[4]
    return None


def _md5(path: Path, state: dict, counts: dict, pre: dict | None = None) -> str:
    """The md5 of ``path``: known (counted as cached), hashed ahead by ``_verify`` (``pre``: used only while the
    file's stat is still the one taken before that read; a file replaced since is hashed again) or hashed now."""
    if (known := _known(path, state)) is not None:
        counts["cached"] += 1
        return known
    ahead = pre.get(path) if pre else None
    stat, digest = ahead if ahead is not None and ahead[0] == _stat(path) else _stamped_md5(path)
    k, key = state_key.key(), (str(path), *stat)
    counts["hashed"] += 1
    if k:
        state[str(path)] = [*stat, digest, state_key.seal(k, str(path), stat, digest)]
    _MEMO[key] = digest
    return digest


def _fix(rel: str) -> str:
    return (
        f"restore it from git's record with `{dvc_checkout(rel)}` (or `{dvc_pull(rel)}` from a remote you "
        f"trust); if you rebuilt it yourself on purpose, record it with `dvc commit`"
    )


def _cached_manifest(root: Path, h: str) -> list[dict] | None:
    """The DVC cache's file list of a directory output with md5 ``h``, when the cache holds an intact one."""
    path = cache_object(root, h + ".dir")
    try:
        raw = path.read_bytes()
        return json.loads(raw) if hashlib.md5(raw).hexdigest() == h else None
    except (OSError, ValueError):
        return None


def _listing_md5(files: dict[str, str]) -> str:
    """The md5 DVC gives a directory: of its file list as DVC serializes it (dvc_data Tree.as_bytes)."""
    entries = sorted(({"md5": m, "relpath": r} for r, m in files.items()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest()


def _dvcignored(root: Path, base: Path, files) -> set[str]:
    """The files (relative to ``base``) that ``root/.dvcignore`` hides from DVC, which leaves them out of a
    directory's listing: a student folder's model card, rewritten by evaluate (zgtrain/student/card.py)."""
    try:
        lines = (root / ".dvcignore").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return set()
    import pathspec

    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    prefix = Path(os.path.relpath(base, root)).as_posix()
    return {f for f in files if spec.match_file(f"{prefix}/{f}")}


def _files(p: Path) -> list[Path]:
    """The files of an output: itself, or every file under the folder."""
    if not p.is_dir():
        return [p] if p.exists() else []
    return [Path(d) / f for d, _, files in os.walk(p) for f in files]


def _check_dir(
    root: Path, rel: str, md5: str, state: dict, counts: dict, by: str, fix: str, pre: dict | None = None
) -> None:
    """The directory's files, hashed, give the md5 its record (``by``) holds (no cache needed); on a mismatch, the
    cache's file list (when it has one) names the file that differs."""
    h, base = md5.removesuffix(".dir"), root / rel
    have = {Path(os.path.relpath(f, base)).as_posix(): _md5(f, state, counts, pre) for f in _files(base)}
    if _listing_md5(have) == h:
        return
    hidden = _dvcignored(root, base, have)  # read only now: a listing that matches needs no .dvcignore
    if hidden:
        have = {f: m for f, m in have.items() if f not in hidden}
        if _listing_md5(have) == h:
            return
    listed = _cached_manifest(root, h)
    if listed is None:
        raise ZgError(f"{rel} does not match {by} (the md5 of its files differs from the one git records)", fix=fix)
    want = {e["relpath"]: e["md5"] for e in listed}
    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    changed = sorted(f for f in set(have) & set(want) if have[f] != want[f])
    if changed:
        raise ZgError(f"{rel}/{changed[0]} does not match {by} (its md5 differs from the one git records)", fix=fix)
    what = (
        f"{len(missing)} recorded file(s) missing (e.g. {missing[0]})"
        if missing
        else f"{len(extra)} file(s) {by} does not record (e.g. {extra[0]})"
    )
    raise ZgError(f"{rel} does not match {by}: {what}", fix=fix)


def _load_state(root: Path) -> dict:
    try:
        return json.loads((root / STATE).read_text())
    except (OSError, ValueError):
        return {}


def _save_state(root: Path, state: dict) -> None:
    path = inside(root / STATE, root, what="output")  # .zg/ linked elsewhere: refused, not written through
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache only: a read-only project is checked again next time


def verify(*paths: Path | str) -> Checked:
    """Check each path that ``dvc.lock`` records against it, and each path that a ``.dvc`` file records (the path
    itself or a folder holding it: the whole folder is checked once) against that file."""
    return _verify(paths, {})


def _verify(paths, read: dict) -> Checked:
    """``verify``, given the ``.dvc`` files already read (path -> dvc_added.outputs), which it adds to."""
    counts = {"outputs": 0, "hashed": 0, "cached": 0}
    by_root: dict[Path, list[Path]] = {}
    for p in paths:
        p = Path(p).absolute()
        root = _project_root(p.parent)
        if root is not None:
            by_root.setdefault(root, []).append(p)
    for root, ps in by_root.items():
        rec = recorded(root)
        todo: dict[Path, tuple[str, str, str]] = {}  # output -> (md5, the record that gives it, the fix)
        for p in ps:
            rel = os.path.normpath(os.path.relpath(p, root))
            if rel in rec:
                todo.setdefault(p, (rec[rel], "dvc.lock", _fix(rel)))
            elif r := dvc_added.holding(root, p, read):
                todo.setdefault(r.out, (r.md5, r.by, r.fix))
        if not todo:
            continue
        try:
            _check_root(root, todo, counts)
        except FileNotFoundError as e:  # listed, then gone before it was read
            gone = os.path.relpath(e.filename, root) if e.filename else "a file"
            raise ZgError(
                f"{gone} disappeared while it was being checked against git's record: another process (a `dvc "
                f"checkout`, a `dvc pull`, a zg stage) changed the output meanwhile",
                fix="run the command again once that process has finished",
            ) from e
    return Checked(**counts)


def _check_root(root: Path, todo: dict[Path, tuple[str, str, str]], counts: dict) -> None:
    state = _load_state(root)
    before = counts["hashed"]
    # every file not known yet, hashed at once on the cores; the checks below then only compare
    unknown = [f for out in todo for f in _files(out) if _known(f, state) is None]
    pre = _stamped_md5s(unknown) if len(unknown) > 1 else {}
    for out, (md5, by, fix) in todo.items():
        _check(root, out, md5, by, fix, state, counts, pre)
    if counts["hashed"] != before:
        _save_state(root, state)


def _check(root: Path, p: Path, md5: str, by: str, fix: str, state: dict, counts: dict, pre: dict) -> None:
    rel = os.path.normpath(os.path.relpath(p, root))
    if not p.exists():
        raise ZgError(
            f"{rel} is missing ({by} records it)",
            fix=f"restore it with `{dvc_checkout(rel)}` or `{dvc_pull(rel)}`",
        )
    counts["outputs"] += 1
    if md5.endswith(".dir"):
        _check_dir(root, rel, md5, state, counts, by, fix, pre)
    elif _md5(p, state, counts, pre) != md5:
        raise ZgError(f"{rel} does not match {by} (its md5 differs from the one git records)", fix=fix)


def _in_git(root: Path) -> set[str]:
    """Files git itself tracks under ``root`` (outputs declared ``cache: false``, such as reports and metrics)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {os.path.normpath(p) for p in out.decode(errors="replace").split("\0") if p}


def verify_all(root: Path | str = ".") -> Checked:
    """``zg data verify --full``: every output dvc.lock records that is present in the workspace, except files git
    tracks itself (``cache: false`` reports and metrics: no remote serves them, and `git status` shows an edit;
    zg rewrites some of them, such as reports/verify.json, outside ``dvc repro``), and every output of the
    ``.dvc`` files git tracks (``dvc add``)."""
    root = Path(root).absolute()
    tracked = _in_git(root)
    present = [root / rel for rel in recorded(root) if (root / rel).exists() and rel not in tracked]
    read: dict = {}  # each .dvc file read once (one `git show`), here and by the check
    for f in sorted(tracked):
        if f.endswith(".dvc") and (root / f).is_file():
            read[root / f] = dvc_added.outputs(root / f, root)
            present += [r.out for r in read[root / f] if root in r.out.parents and r.out.exists()]
    return _verify(present, read)

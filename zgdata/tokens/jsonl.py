"""JSONL corpora (``.jsonl``, ``.jsonl.gz``): one JSON object per line, each a document (zgdata/tokens/corpus.py
says how ids and held-out fields are found). A line longer than ``stream_bytes`` is checked in a first pass by the
streaming scanner (zgdata/tokens/jsonscan.py) and its text read again in chunks when it is used; a line the
scanner cannot follow exactly is read whole, so every error and value is the one the whole read gives."""

from __future__ import annotations

import codecs
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from zgdata.config import CorpusConfig
from zgdata.errors import ZgError
from zgdata.tokens.documents import CHUNK, KEY, Doc, Stream, changed, record_doc, stem
from zgdata.tokens.jsonscan import Fallback, Long, Scan, drain, members

__all__ = ["read_jsonl"]


def _opener(path: Path):
    return gzip.open if path.name.endswith(".gz") else open


def read_jsonl(path: Path, cfg: CorpusConfig, stream_bytes: int | None = None) -> Iterator[Doc]:
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
            yield record_doc(rec, where, f"{name}#{n}", cfg)


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


def _line_chars(f, path: Path, n: int, first: bytes) -> Iterator[str]:
    """The rest of a line, ``first`` its bytes read so far, decoded (strict UTF-8) ``CHUNK`` bytes at a time."""
    dec = codecs.getincrementaldecoder("utf-8")()
    raw = first
    while True:
        last = not raw or raw.endswith(b"\n")
        try:
            yield dec.decode(raw, final=last)
        except UnicodeDecodeError as e:
            raise Fallback from e
        if last:
            return
        raw = _read_line(f, path, n - 1, CHUNK)


def _long_line(f, path: Path, first: bytes, at: int, n: int, cfg: CorpusConfig, limit: int) -> Doc | None:
    """A long JSONL line's document, its text a Stream (the file is left at the next line); None when the line is to
    be read whole (the caller does it)."""
    where = f"{path} line {n}"
    try:
        rec = drain(members(Scan(_line_chars(f, path, n, first)), limit))
    except Fallback:
        return None
    text = rec.get(cfg.text_field)
    names = (cfg.id_field, cfg.heldout_field) if cfg.heldout_field else (cfg.id_field,)
    if any(isinstance(rec.get(k), Long) for k in names):
        return None
    if not isinstance(text, Long):
        return record_doc(rec, where, f"{stem(path)}#{n}", cfg)
    member = text.member

    def chunks() -> Iterator[str]:
        with _opener(path)(path, "rb") as g:
            g.seek(at)
            try:
                yield from members(Scan(_line_chars(g, path, n, _read_line(g, path, n - 1, CHUNK))), limit, member)
            except Fallback as e:
                raise changed(where) from e

    return record_doc(rec, where, f"{stem(path)}#{n}", cfg, Stream(chunks, text.blank))

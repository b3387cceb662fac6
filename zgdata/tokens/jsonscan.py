"""One JSON object, arriving as a stream of text chunks, taken apart as ``json.loads`` does, with its string values
decoded in segments of about one chunk: the long-line reader of JSONL corpora (zgdata/tokens/corpus.py).

Pure: no files. ``members(Scan(chunks), limit)`` returns the object, a string value longer than ``limit``
characters standing as a ``Long`` (where it is, whether it is blank); ``members(..., want=i)`` yields the segments
of member i's string instead. Every value other than such strings is parsed by json's own scanner, so values and
errors are json's. ``Fallback`` says the scan cannot follow the line exactly (not valid JSON, a key or a non-string
value longer than ``limit``): the caller reads the line whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Fallback", "Scan", "Long", "members", "drain"]


class Fallback(Exception):
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
        raise Fallback from e


class Scan:
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
            raise Fallback
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
                    raise Fallback
                self.pos = end
                return v
            if self.eof or len(self.buf) - self.pos > limit + 3:
                raise Fallback
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
                raise Fallback  # unterminated
            start = 0


@dataclass
class Long:
    """A string value longer than the limit: where it is, and whether it is blank."""

    member: int
    blank: bool


def members(scan: Scan, limit: int, want: int = -1):
    """Parse the line's object. Yields the decoded segments of member ``want``'s string value (and stops there);
    returns the record, a string value longer than ``limit`` as a Long."""
    rec: dict = {}
    scan.expect("{")
    if scan.char() == "}":
        scan.pos += 1
    else:
        i = 0
        while True:
            if scan.char() != '"':
                raise Fallback
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
                raise Fallback
    if scan.char() != "":
        raise Fallback
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
    return "".join(parts) if n <= limit else Long(member, blank)


def drain(gen):
    """The return value of a generator, whatever it yields."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value

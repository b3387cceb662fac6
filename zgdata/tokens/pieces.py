"""A streamed document's pieces: the cuts zgdata/tokens/encode.py makes in a whole text, made as the chunks of a
long document arrive (``stream_pieces``), so a document never held whole encodes to the ids of the whole text;
and the one call that hashes, encodes and packs such a document piece by piece (``add_streamed``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator

import numpy as np

from zgdata.tokens.documents import Doc
from zgdata.tokens.encode import pipelined, plain_backend, splittable

__all__ = ["stream_pieces", "cuttable", "add_streamed"]

_CUT = re.compile(r"[!-~][ \n]")  # encode.py's cut: before a space or newline that follows an ASCII non-space


def stream_pieces(chunks: Iterable[str], limit: int) -> Iterator[str]:
    """The pieces ``zgdata.tokens.encode.pieces(text, limit)`` gives, of the text the chunks make up, read as they come:
    about ``limit`` characters buffered, more only while no cut is in sight."""
    it, buf, done = iter(chunks), "", False
    while True:
        while not done and len(buf) <= limit:  # the rest fits, or a cut at or before the limit is in sight
            nxt = next(it, None)
            done = nxt is None
            buf += nxt or ""
        if len(buf) <= limit:
            if buf:
                yield buf
            return
        cut = next((i for i in range(limit, 0, -1) if buf[i] in " \n" and "!" <= buf[i - 1] <= "~"), 0)
        scanned = limit
        while not cut:  # none before the limit: the first after it, reading on as long as there is none
            m = _CUT.search(buf, scanned)
            if m is not None:
                cut = m.start() + 1
            elif done:
                cut = len(buf)
            else:
                scanned = max(limit, len(buf) - 1)
                nxt = next(it, None)
                done = nxt is None
                buf += nxt or ""
        yield buf[:cut]
        buf = buf[cut:]


def cuttable(tok) -> bool:
    """Whether ``batch_encoder(tok)`` encodes a long text in pieces (so its pieces may be encoded one by one)."""
    backend = plain_backend(tok)
    return backend is not None and splittable(backend)


def add_streamed(d: Doc, encode, in_pieces: bool, packer, piece_chars: int) -> str:
    """A streamed document into ``packer``, piece by piece (the next piece encoded while this one is packed);
    returns sha256(text) (hex)."""
    h = hashlib.sha256()
    if not in_pieces:  # one call on the whole text (a tokenizer that cannot be cut)
        text = d.text or "".join(d.chunks())
        for i in range(0, len(text), piece_chars):
            h.update(text[i : i + piece_chars].encode())
        packer.add(d.id, encode([text])[0])
        return h.hexdigest()
    first = True
    for piece, (ids,) in pipelined(stream_pieces(d.chunks(), piece_chars), lambda p: encode([p])):
        h.update(piece.encode())
        packer.add(d.id, ids, first=first, last=False)
        first = False
    packer.add(d.id, np.empty(0, np.int32), first=first, last=True)
    return h.hexdigest()

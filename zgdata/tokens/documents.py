"""What a corpus reader hands over: documents (``Doc``, a long one's text as a ``Stream``), their sources and the
digest of a set of them; and the one way a record becomes a document (``record_doc``: its text, id and held-out
field, with the errors that name the field). Pure: the readers of zgdata/tokens/corpus.py, jsonl.py and records.py
build on it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from zgdata.config import CorpusConfig
from zgdata.core.hashing import sha256_bytes
from zgdata.errors import ZgError

__all__ = [
    "KEY",
    "CHUNK",
    "TEXT_SUFFIXES",
    "CorpusDigest",
    "Stream",
    "Doc",
    "Source",
    "stem",
    "detect",
    "changed",
    "record_doc",
]

TEXT_SUFFIXES = (".txt", ".md")
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


def detect(path: Path) -> str | None:
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


def changed(where) -> ZgError:
    return ZgError(
        f"{where} changed while it was being read", key=KEY, fix="leave the corpus alone while it is tokenized"
    )


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


def record_doc(rec, where: str, fallback_id: str, cfg: CorpusConfig, stream: Stream | None = None) -> Doc:
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

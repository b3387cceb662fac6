"""The machinery every params section uses: ``param()``, ``Section`` and its checks, reading params.yaml.

One keyword-only frozen dataclass per section (zgdata/config/sections.py, corpus.py; zgtrain/project/config.py, sections.py).
Each field is declared with ``param()``: its default, its documentation (``zg params`` prints it) and its allowed
range. ``Section.__post_init__`` coerces values where YAML is ambiguous (``1e-3`` is read as a string) and refuses
every other wrong type or out-of-range value with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from zgdata.errors import ZgError
from zgdata.yamlio import SafeLoader

__all__ = [
    "Section",
    "param",
    "load_params",
    "section",
    "describe",
    "defaults",
    "check_int",
    "check_field",
    "allowed_values",
    "bad_value",
    "rekeyed",
    "DTYPES",
    "MAX_STEPS",
    "MAX_BATCH",
    "ProjectKind",
    "project_kind",
]

DTYPES = ("float32", "bfloat16")
T = TypeVar("T")


# Bounds on params that size a run's time and memory: far above any real run, so a typo (10**30 steps, a batch of
# 10**12 sequences) is refused when params are read instead of hanging or filling memory. The data bounds the batch
# further when a run starts (zgdata/store/reader.py ``check_batch``).
MAX_STEPS = 10**8
MAX_BATCH = 2**16


def param(default, doc: str, *, ge=None, gt=None, lt=None, le=None, choices=None, item: str | None = None):
    """A section field: default, one-line doc, and its allowed range (checked in ``Section.__post_init__``)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "lt": lt, "le": le, "choices": choices, "item": item}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


def allowed_values(kind: str, m: Mapping) -> str:
    """What a field of ``kind`` with metadata ``m`` accepts, in words (the fix of its error line)."""
    if m.get("choices"):
        return "one of " + ", ".join(map(str, m["choices"]))
    noun = {
        "int": "an integer",
        "float": "a finite number",
        "str": "a string",
        "bool": "true or false",
        "list": "a list" + (f" of {m['item']}s" if m.get("item") else ""),
    }.get(kind, "a value")
    lo = f"[{m['ge']}" if m.get("ge") is not None else f"({m['gt']}" if m.get("gt") is not None else None
    hi = f"{m['le']}]" if m.get("le") is not None else f"{m['lt']})" if m.get("lt") is not None else None
    if lo and hi:
        return f"{noun} in {lo}, {hi}"
    if lo:
        return f"{noun} {'>=' if lo[0] == '[' else '>'} {lo[1:]}"
    if hi:
        return f"{noun} {'<=' if hi[-1] == ']' else '<'} {hi[:-1]}"
    return noun


def rekeyed(e: ZgError, section: str, where: str, given) -> ZgError | None:
    """``e``, an error of ``section.NAME``, named ``where.NAME`` instead when NAME (or the key NAME[i] is an item
    of) is among ``given``, the keys an entry set itself (a block's, a variant's, a mix source's); None when the
    value came from elsewhere."""
    name = (e.key or "").removeprefix(f"{section}.")
    if name.split("[", 1)[0] not in given:
        return None
    return ZgError(e.what.replace(f"{section}.{name}", f"{where}.{name}"), key=f"{where}.{name}", fix=e.fix)


def bad_value(key: str, value, want: str) -> ZgError:
    """The one-line error for ``key`` set to ``value``, saying to use ``want``."""
    return ZgError(f"{key} is {value!r} ({type(value).__name__})", key=key, fix=f"use {want}")


def _number(value):
    """A YAML-ambiguous number: ints/floats as they are, numeric strings (``1e-3``) parsed, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _coerce(key: str, kind: str, value, m: Mapping):
    want = allowed_values(kind, m)
    if kind == "int":
        n = _number(value)
        if n is None or (isinstance(n, float) and not (math.isfinite(n) and n.is_integer())):
            raise bad_value(key, value, want)
        value = int(n)
    elif kind == "float":
        n = _number(value)
        if n is None or not math.isfinite(n):
            raise bad_value(key, value, want)
        value = float(n)
    elif kind == "str":
        if not isinstance(value, str):
            raise bad_value(key, value, want)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad_value(key, value, want)
    elif kind == "list":
        if not isinstance(value, list):
            raise bad_value(key, value, want)
        if m.get("item"):
            value = [_coerce(f"{key}[{i}]", m["item"], v, {}) for i, v in enumerate(value)]
        return value
    if m.get("choices") is not None and value not in m["choices"]:
        raise bad_value(key, value, want)
    for bound, ok in (
        ("ge", lambda v, b: v >= b),
        ("gt", lambda v, b: v > b),
        ("le", lambda v, b: v <= b),
        ("lt", lambda v, b: v < b),
    ):
        if m.get(bound) is not None and not ok(value, m[bound]):
            raise bad_value(key, value, want)
    return value


def _kind(f) -> str:
    """A section field's kind as ``_coerce`` names it (``int``, ``str``...; ``Any`` for a type it does not check)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "Any")


@dataclass(kw_only=True, frozen=True)
class Section:
    """Base of every params section: fields declared with ``param()`` are coerced and range-checked."""

    SECTION: ClassVar[str] = ""
    # fields that change no trained bit (a checkpoint's period, a schedule of the same work): a resume may change
    # them (``identity``)
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ()
    # fields that change none of a stage's outputs, neither a bit nor a figure it writes (a checkpoint's period;
    # not cached vs online targets, which the metrics record): the stage depends on every other field only
    # (``stage_keys``), so editing one of these reruns nothing
    UNRECORDED: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        for f in fields(self):
            kind = _kind(f)
            if kind in ("int", "float", "str", "bool", "list"):
                object.__setattr__(self, f.name, _coerce(self.key(f.name), kind, getattr(self, f.name), f.metadata))
        self.validate()

    @classmethod
    def key(cls, name: str) -> str:
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    @classmethod
    def stage_keys(cls, *, without: tuple[str, ...] = ()) -> list[str]:
        """The params keys (``train.lr``, ...) of every field but ``UNRECORDED`` and ``without``: what a DVC stage
        lists, one by one, so an edit of a field that changes none of its outputs reruns nothing."""
        return [cls.key(f.name) for f in fields(cls) if f.name not in (*cls.UNRECORDED, *without)]

    def identity(self) -> dict:
        """The fields that make the trained bits: every one but ``NOT_IDENTITY`` (a run's resume check)."""
        return {k: v for k, v in asdict(self).items() if k not in self.NOT_IDENTITY}

    def validate(self) -> None:
        """Checks that span fields or need more than a range (overridden by sections that have them)."""


def check_int(key: str, value, *, ge: int | None = None) -> int:
    """One value outside a section (the global seed, a CLI option), checked like a section field."""
    return _coerce(key, "int", value, {"ge": ge})


def check_field(key: str, section: type[Section], name: str, value):
    """A CLI option that overrides ``section``'s field ``name``, checked by that field's rules and named ``key``."""
    f = next(f for f in fields(section) if f.name == name)
    return _coerce(key, _kind(f), value, f.metadata)


class _UniqueKeyLoader(SafeLoader):
    """SafeLoader that refuses a mapping with a repeated key (PyYAML keeps the last one silently)."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        k = loader.construct_object(key_node, deep=deep)
        if k in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key '{k}' (first at line {seen[k] + 1}, again at line {key_node.start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[k] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_params(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ZgError(f"{path} not found", fix="run inside a ZeroGraph project or create one with `zg init DIR`")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ZgError(
            f"{path} is not UTF-8 text: byte 0x{e.object[e.start]:02x} at line {line}",
            fix="save it as UTF-8 (replace or remove that byte)",
        ) from e
    except yaml.YAMLError as e:
        raise ZgError(f"{path} is not valid YAML: {e}".replace("\n", " "), fix="fix the syntax") from e
    if not isinstance(data, dict):
        raise ZgError(f"{path} must be a mapping of sections", fix="see `zg params`")
    return data


class ProjectKind(enum.Enum):
    """What a project trains: the two kinds of params.yaml (and of dvc.yaml, see zgtrain/pipeline/stages.py)."""

    CONVERT = "convert"
    """Convert or distil a teacher block by block from its materialized boundaries (``blocks:``, ``variants:``)."""
    LOCAL = "local"
    """Greedy local pretraining from scratch (a ``local:`` section): the teacher gives its tokenizer only."""


def project_kind(params: Mapping[str, Any]) -> ProjectKind:
    """The one place a params.yaml's kind is decided: a ``local:`` section makes it a local-pretraining project.

    A variant library (``variants:``) belongs to a conversion, so params with both are refused."""
    if "local" not in params:
        return ProjectKind.CONVERT
    if "variants" in params:
        raise ZgError(
            "params.yaml has both local: (local pretraining from scratch) and variants: (a conversion's "
            "variant library)",
            key="variants",
            fix="remove variants: for local pretraining, or local: for a conversion",
        )
    return ProjectKind.LOCAL


def section(params: Mapping[str, Any], cls: type[T], key: str | None = None) -> T:
    """Build ``cls`` from ``params[key]`` (default: the class's own section), naming any unknown key."""
    key = key or cls.SECTION
    raw = params.get(key)
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ZgError(
            f"params section '{key}' must be a mapping, not {type(raw).__name__}", key=key, fix="see `zg params`"
        )
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ZgError(
            f"unknown key(s) {', '.join(key + '.' + str(u) for u in unknown)}",
            key=key,
            fix=f"known keys: {', '.join(sorted(known))}",
        )
    return cls(**raw)


def _default(f):
    return (
        f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else None)
    )


def defaults(cls: type) -> dict:
    """{field: default} of a section, in declaration order (what params.yaml profiles start from)."""
    return {f.name: _default(f) for f in fields(cls)}


def describe(cls: type) -> list[tuple[str, str, str]]:
    """(key, default, doc + allowed values) for each field of a section."""
    out = []
    for f in fields(cls):
        m = f.metadata
        kind = _kind(f)
        doc = m.get("doc", "")
        if kind in ("int", "float") and any(m.get(b) is not None for b in ("ge", "gt", "lt", "le")):
            doc += f" Allowed: {allowed_values(kind, m)}."
        out.append((f.name, repr(_default(f)), doc))
    return out

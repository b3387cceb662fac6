"""The ``teacher:``, ``partition:``, ``materialize:`` and ``verify:`` sections of params.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from zgdata.config.base import DTYPES, Section, allowed_values, bad_value, param
from zgdata.errors import ZgError
from zgdata.layout import boundary_name

__all__ = ["TeacherConfig", "BlockSpec", "PartitionConfig", "MaterializeConfig", "VerifyConfig"]


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
        "Materialize, verify and online targets compute in materialize.compute_dtype; evaluate, lm-eval, the "
        "search's judging and repair's teacher in float32; the sample stage in corpus.sample.dtype.",
        choices=(*DTYPES, "auto"),
    )


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
        "dtype the teacher forwards of materialize, verify and online targets compute in "
        "(part of the boundary fingerprint; evaluate's run in float32). float32 over a bf16 teacher "
        "keeps the teacher bf16 and widens one layer at a time (same bits as a "
        "whole fp32 copy, without it).",
        choices=DTYPES,
    )
    batch_size: int = param(
        4,
        "Sequences per teacher forward: materialize, online targets and verify all run this many, a short last "
        "batch padded with copies. On a GPU a row's bits can follow the count (kernels are chosen by shape), "
        "and the count is not lineage: after changing it there, rematerialize (`dvc repro -f materialize`).",
        ge=1,
    )
    commit_rows: int = param(
        0,
        "Most sequences per commit group (0: no row bound; commit_mb and commit_seconds decide). "
        "A killed run resumes from the last commit, losing at most one group.",
        ge=0,
    )
    commit_mb: int = param(
        2048,
        "A commit group closes once it holds this many MiB of hidden states (all boundaries); "
        "each group is one Lance version and one data file per boundary.",
        ge=1,
    )
    commit_seconds: float = param(600.0, "A commit group also closes after this many seconds.", gt=0)
    file_mb: int = param(
        16384,
        "Finalize compacts each boundary into data files of about this many MiB (decoded values) "
        "and publishes it as one Lance version.",
        ge=1,
    )
    queue_batches: int = param(4, "Bound on batches waiting for the background writer (caps memory).", ge=1)
    write_behind_mb: int = param(
        32,
        "Sync a commit group's new files every this many MiB of record batches, in a thread of its own, so the disk "
        "writes while the next batches encode instead of after the kernel's 30 s or 10% of RAM of dirty pages "
        "(no byte changes, no durability promised; 0: leave it to the kernel).",
        ge=0,
    )
    writer_threads: int = param(
        0,
        "Threads that encode, checksum and take stats of captured boundaries (zstd, xxhash, numpy and the "
        "stats' compiled torch loop release the GIL). 0: the cores left after the forward (all but one beside a "
        "GPU; beyond torch's threads on CPU), of those the process may use (its CPU affinity and its container's "
        "CPU quota), at least 1; with workers > 1, 1 per shard task. The bytes written do not depend on it.",
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
        "How hidden states are stored: raw (one column of the dtype's bits, plain Lance), blob (the same bits, "
        "each row a Lance blob in packed sidecar files: the cheapest write, 15-25% less CPU per GB than raw), zstd "
        "(lossless byte split: zstd level 3 of the sign/exponent bytes, ~0.72x raw on bf16) or zstd_fast "
        "(the same split with zstd's fast strategy: the same size, several times the encode speed) or zstd_blob "
        "(zstd_fast's two planes as Lance blobs in packed sidecars: the same bytes a row, written at several times "
        "the rate at an 8B teacher's 16 MB rows): "
        "lossless, never lineage (the values, fingerprint and training bits are the same). Lossy, bf16 only: "
        "int8 (per-token scale, each token's 4 largest values kept exact, zstd over the int bytes), int7 or "
        "int6 (the same with 127 or 63 levels); their parameters are lineage (in the fingerprint), and online targets, "
        "verify and a virtual h00 apply the same quantization (docs/results/write-path.md).",
        choices=("raw", "blob", "zstd", "zstd_fast", "zstd_blob", "int8", "int7", "int6"),
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
                fix="set materialize.storage_dtype: bfloat16, or a lossless codec (raw, blob, zstd, zstd_fast, zstd_blob)",
            )
        if self.storage_dtype == "float16":
            raise ZgError(
                "materialize.storage_dtype float16 is refused: teacher activations reach about 25,000, "
                "within 2.6x of the float16 maximum",
                key="materialize.storage_dtype",
                fix="use bfloat16 (default) or float32",
            )
        if self.storage_dtype not in DTYPES:
            raise bad_value("materialize.storage_dtype", self.storage_dtype, allowed_values("str", {"choices": DTYPES}))


@dataclass(kw_only=True, frozen=True)
class VerifyConfig(Section):
    SECTION: ClassVar[str] = "verify"
    sample: int = param(4, "Sequences re-run through the teacher and compared bit for bit.", ge=1)
    seed: int = param(0, "Seed of the sample.", ge=0)

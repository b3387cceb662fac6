"""Write a zg student as one GGUF file that llama.cpp runs (``zg export --format gguf`` calls this).

``check_gguf`` decides everything from the student's config.json, zerograph.json and tokenizer before a byte
is written: the llama.cpp architecture of its family (zgtrain/export/gguf_arch.py: the family's own arch for a
uniform student, ``deci`` for Llama-like students with per-layer MLP widths or KV heads), its windows, its rotary, its
experts (zgtrain/export/gguf_moe.py: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) and its tokenizer
(zgtrain/export/gguf_vocab.py). Anything llama.cpp cannot express is one ``ZgError`` line naming
the layer or feature and the supported alternative. ``export_gguf`` then loads the student through
``load_student`` (hash-checked safetensors, never a pickle) and writes keys and tensors with the ``gguf``
package, in f32, f16, bf16 or q8_0 (1-D tensors, norms and biases, stay f32 as convert_hf_to_gguf keeps them).
Guide: docs/guides/export_gguf.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zgdata.errors import ZgError
from zgtrain.export.gguf_arch import (
    WIDTHS_FIX,
    ArchSpec,
    check_options,
    check_rope,
    edit_tensor,
    gemma_scale_check,
    spec_of,
    write_hparams,
)
from zgtrain.export.gguf_moe import MoePlan, expert_tensors, is_router, moe_plan, write_moe_hparams
from zgtrain.export.gguf_vocab import VocabInfo, read_vocab, write_vocab
from zgtrain.fit.rerun import model_of

__all__ = ["DTYPES", "check_gguf", "export_gguf"]

DTYPES = ("f32", "f16", "bf16", "q8_0")
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16
_SKIP = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")  # buffers, not weights (GPT-2's c_attn.bias is one)


@dataclass
class _Plan:
    family: str
    spec: ArchSpec
    arch: str
    config: dict
    sizes: list
    layer_types: list | None
    vocab: VocabInfo
    kv_heads: list | None = None  # each layer's KV heads where zerograph.json records them (the kv_heads conversion)
    moe: MoePlan | None = None  # a mixture-of-experts student's expert counts (zgtrain/export/gguf_moe.py)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{path} is missing or unreadable ({e})".split("\n")[0],
            fix="point at a student folder zg assembled (models/student, models/repaired, models/search/student)",
        ) from e


def _refuse_attention(summary: dict, spec: ArchSpec, n_layer: int) -> None:
    """zg's attention conversions no llama.cpp arch expresses: windows, a linear map, linearized attention."""
    windows = summary.get("layer_windows") or [None] * n_layer
    for i, win in enumerate(windows):
        if win is not None:
            raise ZgError(
                f"layer {i} has a zg sliding window of {win} tokens (conversion window_attention), which llama.cpp's "
                f"'{spec.arch}' architecture cannot express",
                fix="keep the student folder (zg's modeling file runs it; `zg export --format hf` takes windows for "
                "mistral, phi3, qwen2 and gemma students), or rebuild that block without window_attention",
            )
    linear = next((i for i, a in enumerate(summary.get("layer_attention") or []) if a == "linear"), None)
    if linear is not None:
        raise ZgError(
            f"layer {linear} has a linear map in place of attention (conversion attn_linear), which llama.cpp's "
            f"'{spec.arch}' architecture cannot express",
            fix="keep the student folder (zg's modeling file runs it), or rebuild that block without attn_linear",
        )
    la = next((i for i, a in enumerate(summary.get("layer_attention") or []) if a.startswith("linear_attention")), None)
    if la is not None:
        raise ZgError(
            f"layer {la} has linearized attention with learned feature maps (conversion linear_attention), which "
            f"llama.cpp's '{spec.arch}' architecture cannot express",
            fix="keep the student folder (zg's modeling file runs it), or rebuild that block without linear_attention",
        )


def _plan(student: Path, dtype: str) -> _Plan:
    student = Path(student)
    if dtype not in DTYPES:
        raise ZgError(f"GGUF dtype '{dtype}' is not one zg writes", fix=f"use one of {', '.join(DTYPES)}")
    summary, cfg = _read(student / "zerograph.json"), _read(student / "config.json")
    family = summary.get("family", "llama")
    spec = spec_of(family)
    sizes = [int(s) for s in summary["intermediate_sizes"]]
    _refuse_attention(summary, spec, len(sizes))
    kv = [int(h) for h in summary.get("layer_kv_heads") or []]
    odd = next((i for i, h in enumerate(kv) if h != kv[0]), None)
    if odd is not None and spec.per_layer_arch is None:  # the kv_heads conversion with different counts per block
        raise ZgError(
            f"layer {odd} has {kv[odd]} KV heads where layer 0 has {kv[0]} (conversion kv_heads): llama.cpp's "
            f"'{spec.arch}' architecture ({family}) reads one head_count_kv for all layers",
            fix="give every block the same train.kv_heads, or keep the student folder (zg's modeling file runs it)",
        )
    for i, width in enumerate(sizes):
        if width <= 0:
            raise ZgError(
                f"layer {i} has no MLP (width {width}); zg does not write MLP-free layers to GGUF", fix=WIDTHS_FIX
            )
    arch = spec.arch
    moe = moe_plan(summary, cfg, family, arch, sizes)  # per-layer expert counts refused before per-layer widths
    if odd is not None:  # per-layer KV heads: deci reads head_count_kv per layer
        arch = spec.per_layer_arch
    if len(set(sizes)) > 1:
        first = next(i for i, s in enumerate(sizes) if s != sizes[0])
        if spec.per_layer_arch is None:
            raise ZgError(
                f"layer {first} has MLP width {sizes[first]} but layer 0 has {sizes[0]}: llama.cpp's '{spec.arch}' "
                f"architecture ({family}) reads one width for all layers",
                fix=WIDTHS_FIX,
            )
        arch = spec.per_layer_arch
    check_rope(cfg, family)
    check_options(cfg, spec)
    if spec.arch == "gemma2" and not cfg.get("tie_word_embeddings", True):
        raise ZgError(
            "this Gemma 2 student has an LM head of its own (tie_word_embeddings: false); llama.cpp's gemma2 "
            "architecture always uses the token embeddings as its head",
            fix="use `zg export --format hf`",
        )
    if spec.window == "pattern":
        gemma_scale_check(cfg, spec, len(sizes))
    layer_types = cfg.get("layer_types")
    if spec.window == "pattern" and layer_types is not None and len(layer_types) != len(sizes):
        raise ZgError(
            f"config.json lists {len(layer_types)} layer types for {len(sizes)} layers",
            fix=f"rebuild the student with `dvc repro -f {model_of(student).stage}`",
        )
    vocab = read_vocab(student, int(cfg["vocab_size"]))
    return _Plan(family, spec, arch, cfg, sizes, layer_types, vocab, kv or None, moe)


def check_gguf(student: Path, *, dtype: str = "f16") -> None:
    """Raise ZgError (one line naming the layer or feature and the supported alternative) if the student cannot be
    expressed in llama.cpp; reads config.json, zerograph.json and the tokenizer, writes nothing."""
    _plan(student, dtype)


def _tensor_data(gguf, x: np.ndarray, dtype: str, keep_f32: bool = False):
    """(data, raw_dtype or None, kind) for one tensor in the file's dtype; 1-D tensors and ``keep_f32`` (routers)
    stay f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1 or dtype == "f32" or keep_f32:
        return x, None, "f32"
    if dtype == "f16" or (dtype == "q8_0" and x.shape[-1] % 32):
        return x.astype(np.float16), None, "f16"
    qtype = gguf.GGMLQuantizationType.Q8_0 if dtype == "q8_0" else gguf.GGMLQuantizationType.BF16
    return gguf.quants.quantize(x, qtype), qtype, dtype


def _write_tensors(gguf, writer, state: dict, plan: _Plan, dtype: str) -> dict:
    """Add each student tensor under its llama.cpp name, as the arch stores it (``edit_tensor``; a fused expert
    tensor as its GGUF tensors, ``expert_tensors``); returns the count per written dtype."""
    arch, moe = plan.arch, plan.moe is not None
    arch_enum = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(arch_enum, len(plan.sizes))
    counts: dict[str, int] = {}
    for key, x in state.items():
        tensors = expert_tensors(gguf, key, x) if moe else None
        if tensors is None:
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise ZgError(
                    f"student tensor {key} has no llama.cpp '{arch}' name",
                    fix="use `zg export --format hf`; report it (zgtrain/export/gguf_arch.py maps the families)",
                )
            tensors = [(name, edit_tensor(key, x, plan.config, plan.spec, arch))]
        for name, y in tensors:
            data, raw, kind = _tensor_data(gguf, y, dtype, keep_f32=moe and is_router(key))
            writer.add_tensor(name, data, raw_dtype=raw)
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def export_gguf(student: Path, out_file: Path, *, dtype: str = "f16") -> dict:
    """Check, then write ``out_file`` (a GGUF llama.cpp loads). Returns what lineage records: arch, dtype,
    n_layers, per-layer n_ff, tensor count and per-dtype counts, the tokenizer's pre-type and special ids."""
    import gguf
    import torch

    from zgtrain.student.load import load_student

    plan = _plan(student, dtype)
    cfg, spec, arch = plan.config, plan.spec, plan.arch
    model = load_student(Path(student), dtype=torch.float32)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items() if not k.endswith(_SKIP)}
    n_layer = len(plan.sizes)
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr() or torch.equal(head, embed)
    out_file = Path(out_file)
    writer = gguf.GGUFWriter(out_file, arch)
    try:
        # a fixed name: llama.cpp's vocab loader keys tokenizer quirks on general.name (a name containing "phi3"
        # gets Phi-3's right-stripping of special tokens), which transformers' tokenizer does not do
        writer.add_name("zg student")
        writer.add_file_type(_FILE_TYPE[dtype])
        if dtype == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        notes = write_hparams(writer, cfg, spec, arch, plan.sizes, plan.layer_types, plan.kv_heads)
        if plan.moe is not None:
            notes.update(write_moe_hparams(writer, plan.moe, arch))
        vocab = write_vocab(writer, plan.vocab)
        head_keys = [k for k in state if k.endswith("lm_head.weight")]
        for key in head_keys:
            if tied and not spec.needs_output:
                del state[key]  # llama.cpp reuses token_embd (TENSOR_DUPLICATED)
        if spec.needs_output and not head_keys:
            embed = next(k for k in state if k.endswith("embed_tokens.weight"))
            state["lm_head.weight"] = state[embed]
        counts = _write_tensors(gguf, writer, state, plan, dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except BaseException:
        writer.close()
        out_file.unlink(missing_ok=True)
        raise
    return {
        "format": "gguf",
        "arch": arch,
        "family": plan.family,
        "dtype": dtype,
        "n_layers": n_layer,
        "n_ff": list(plan.sizes),
        "tensors": sum(counts.values()),
        "tensor_dtypes": counts,
        "tied_embeddings": tied and not spec.needs_output,
        **vocab,
        **notes,
        "bytes": out_file.stat().st_size,
    }

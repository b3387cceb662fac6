"""A zg student as a stock transformers folder (`zg export --format hf`): loads with ``trust_remote_code=False``.

A student zg assembled is already a stock folder when its layers share one MLP width and no layer has a zg
window (``remote_code: false`` in zerograph.json); otherwise it ships zg's pinned modeling file
(zgtrain/student/templates/). This module writes the family's own config wherever that config can say the same
model, and refuses with one line where it cannot:

- per-layer MLP widths: no stock config has them (the first layer whose width differs is named);
- layers dropped: nothing to say, a stock config of fewer layers;
- a linear map in place of a layer's attention (``layer_attention``, the ``attn_linear`` conversion): refused;
- linearized attention (``layer_attention`` ``linear_attention``, the ``linear_attention`` conversion): refused;
- fewer KV heads (the ``kv_heads`` conversion): one count for every layer is the stock ``num_key_value_heads``
  (assemble already wrote it so); per-layer counts (``layer_kv_heads``) are refused, naming the first that differs;
- a mixture-of-experts student's experts and experts per token (``prune_experts``, ``moe_to_dense``): one count
  for every layer is the family's stock fields (``num_experts``/``num_local_experts``, ``num_experts_per_tok``);
  per-layer counts (``layer_experts``, ``layer_top_k``) are refused, naming the first layer that differs;
- zg's sliding windows (``layer_windows``, the ``window_attention`` conversion), combined with the windows the
  family's own config already gives its layers (each layer attends within the smaller of the two):
  Mistral and Phi-3 have one ``sliding_window`` for every layer (so every layer must end with the same window);
  Qwen2 says it per layer (``layer_types`` with ``use_sliding_window``/``sliding_window``/``max_window_layers``,
  one window shared by the sliding layers); Gemma 2 per layer (``layer_types``, one ``sliding_window``); Gemma 3
  per layer too, but its sliding layers use the local rotary base, so only the teacher's sliding layers may
  carry a window; Llama, GPT-2, Granite and OLMo 2 have no sliding-window attention.

The stock model computes logits bit-identical to the student's (``torch.equal``; tests/zgtrain/export/test_hf.py
proves it per family and per case): zg's ``SlidingWindow`` hook and transformers' sliding masks give the same
mask. torch and transformers are imported inside the functions (``zg --help`` never loads them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from zgdata.errors import ZgError, shell_arg
from zgtrain.fit.rerun import model_of

__all__ = ["DTYPES", "TORCH_DTYPES", "read_student", "stock_config", "check_hf", "export_hf"]

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
DTYPES = tuple(TORCH_DTYPES)
# families whose stock config gives every layer one sliding_window / says it per layer (layer_types)
_GLOBAL_WINDOW = ("mistral", "phi3")
_PER_LAYER_WINDOW = ("qwen2", "gemma2", "gemma3_text")
_ROTARY_PER_TYPE = ("gemma3_text",)  # a sliding layer also changes its rotary: only the teacher's may slide
# what a student folder holds that a stock folder does not carry over (the weights and config are rewritten)
_NOT_COPIED = ("config.json", "zerograph.json", "checksums.json", "README.md", "model.safetensors.index.json")
_FIX_KEEP = "keep the student folder, which loads with zg's pinned modeling code (zgtrain.student.load.load_student)"


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{path} is unreadable ({e})".split("\n")[0],
            fix=f"rebuild the student with `dvc repro -f {model_of(path.parent).stage}`",
        ) from e


def read_student(student: Path) -> tuple[dict, dict]:
    """(config.json, zerograph.json) of a student folder zg wrote, or a one-line error."""
    student = Path(student)
    if not student.is_dir():
        raise ZgError(
            f"{student} is not a folder",
            fix="name a student folder, or one of student, repaired, search (run `dvc repro assemble` first)",
        )
    try:
        return _json(student / "config.json"), _json(student / "zerograph.json")
    except FileNotFoundError as e:
        raise ZgError(
            f"{student} is not a zg student ({Path(e.filename).name} missing)",
            fix="export a folder `zg train assemble`, `zg train repair` or `zg search assemble` wrote",
        ) from None


def _refuse(what: str, fix: str) -> ZgError:
    return ZgError(f"cannot export as a stock transformers folder: {what}", fix=fix)


def _gguf_alternative(student: Path) -> str:
    """The fix of a refusal: --format gguf where its writer can express the student, else the student folder."""
    try:
        from zgtrain.export.gguf import check_gguf
    except ImportError:
        return _FIX_KEEP
    try:
        check_gguf(student)
    except ZgError:
        return _FIX_KEEP
    return f"use `zg export {shell_arg(student)} --format gguf` (llama.cpp can say it), or {_FIX_KEEP}"


def _stock_windows(model_type: str, d: dict, n: int) -> list:
    """Each layer's window as the family's own config gives it (None: full attention)."""
    types = d.get("layer_types") or ["full_attention"] * n
    if model_type in _GLOBAL_WINDOW:
        return [d.get("sliding_window")] * n
    if model_type in _PER_LAYER_WINDOW:
        on = d.get("use_sliding_window", True)  # Qwen2's switch; Gemma's sliding layers always slide
        return [d.get("sliding_window") if on and t == "sliding_attention" else None for t in types]
    return [None] * n


def _with_windows(student: Path, model_type: str, name: str, d: dict, windows: list) -> dict:
    n = len(windows)
    stock = _stock_windows(model_type, d, n)
    eff = [min((x for x in (s, w) if x is not None), default=None) for s, w in zip(stock, windows)]
    first = next(i for i, w in enumerate(windows) if w is not None)
    if model_type not in _GLOBAL_WINDOW + _PER_LAYER_WINDOW:
        raise _refuse(
            f"layer {first} attends within a window of {windows[first]} tokens and a stock {name} config has no "
            "sliding-window attention",
            _gguf_alternative(student),
        )
    types = d.get("layer_types") or ["full_attention"] * n
    if model_type in _ROTARY_PER_TYPE:
        moved = [i for i, (t, w) in enumerate(zip(types, eff)) if w is not None and t != "sliding_attention"]
        if moved:
            raise _refuse(
                f"layer {moved[0]} is a full-attention layer with a window of {eff[moved[0]]} tokens; a stock "
                f"{name} sliding layer also uses the local rotary base, so only the teacher's sliding layers can "
                "have a window",
                _gguf_alternative(student),
            )
    sizes = sorted({w for w in eff if w is not None})
    if len(sizes) > 1:
        a = eff.index(sizes[0])
        b = eff.index(sizes[1])
        raise _refuse(
            f"layer {a} attends within {sizes[0]} tokens and layer {b} within {sizes[1]}; a stock {name} config "
            "has one sliding_window",
            _gguf_alternative(student),
        )
    window = sizes[0]
    out = dict(d)
    if model_type in _GLOBAL_WINDOW:
        full = [i for i, w in enumerate(eff) if w is None]
        if full:
            raise _refuse(
                f"layer {full[0]} attends fully while layer {first} has a window of {window} tokens; a stock {name} "
                "config gives every layer the same sliding_window",
                _gguf_alternative(student),
            )
        out["sliding_window"] = window
        return out
    out["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in eff]
    out["sliding_window"] = window
    if model_type == "qwen2":  # as Qwen2Config reads them: sliding_window only counts with use_sliding_window
        out["use_sliding_window"] = True
        out["max_window_layers"] = out["layer_types"].index("sliding_attention")
    return out


def stock_config(student: Path) -> dict:
    """The family's own config.json (a dict) that says the same model as the student, or a one-line refusal."""
    from zgdata.families.registry import family, family_of

    cfg, summary = read_student(student)
    fam = family(str(summary.get("family", "llama")))
    if fam.verified:  # its parts (the width field) are found from the config
        fam = family_of(cfg)
    name = fam.model_class.removesuffix("ForCausalLM").removesuffix("LMHeadModel")
    widths = list(summary.get("intermediate_sizes") or [])
    if not widths:
        raise ZgError(f"{student}/zerograph.json records no intermediate_sizes", fix="rebuild the student")
    windows = list(summary.get("layer_windows") or [None] * len(widths))
    odd = next((i for i, w in enumerate(widths) if w != widths[0]), None)
    if odd is not None:
        raise _refuse(
            f"layer {odd} has MLP width {widths[odd]} where layer 0 has {widths[0]}, and a stock {name} config "
            f"has one {fam.width_attr}",
            _gguf_alternative(student),
        )
    linear = next((i for i, a in enumerate(summary.get("layer_attention") or []) if a == "linear"), None)
    if linear is not None:
        raise _refuse(
            f"layer {linear} has a linear map in place of attention (conversion attn_linear), which a stock {name} "
            "config cannot express",
            _FIX_KEEP,
        )
    la = next((i for i, a in enumerate(summary.get("layer_attention") or []) if a.startswith("linear_attention")), None)
    if la is not None:
        raise _refuse(
            f"layer {la} has linearized attention with learned feature maps (conversion linear_attention), which a "
            f"stock {name} config cannot express",
            _FIX_KEEP,
        )
    kv = list(summary.get("layer_kv_heads") or cfg.get("layer_kv_heads") or [])
    odd = next((i for i, h in enumerate(kv) if h != kv[0]), None)
    if odd is not None:
        raise _refuse(
            f"layer {odd} has {kv[odd]} KV heads where layer 0 has {kv[0]}, and a stock {name} config has one "
            "num_key_value_heads",
            _gguf_alternative(student),
        )
    counts = _expert_counts(fam, name, summary)
    d = {k: v for k, v in cfg.items() if k not in _ZG_KEYS}
    d.update(counts)
    if kv:
        d["num_key_value_heads"] = kv[0]
    d.update(model_type=fam.model_type, architectures=[fam.model_class])
    d[fam.width_attr] = widths[0]
    if any(w is not None for w in windows):
        d = _with_windows(student, fam.model_type, name, d, windows)
    return d


_ZG_KEYS = (
    "auto_map",
    "intermediate_sizes",
    "layer_windows",
    "layer_kv_heads",
    "layer_attention",
    "mlp_fields",
    "layer_experts",
    "layer_top_k",
)


def _expert_counts(fam, name: str, summary: dict) -> dict:
    """A mixture-of-experts student's one expert count and top-k as its stock config fields ({} for a dense one),
    or a one-line refusal naming the first layer whose count differs."""
    if fam.moe is None:
        return {}
    out = {}
    for key, field, what in (
        ("layer_experts", fam.moe.experts, "experts"),
        ("layer_top_k", fam.moe.top_k, "experts per token"),
    ):
        values = list(summary.get(key) or [])
        odd = next((i for i, v in enumerate(values) if v != values[0]), None)
        if odd is not None:
            raise _refuse(
                f"layer {odd} has {values[odd]} {what} where layer 0 has {values[0]}, and a stock {name} config has "
                f"one {field}",
                "give every block the same train.keep_experts / train.active_experts (or the same expert "
                "conversion), or keep the student folder (zg's modeling file runs it)",
            )
        if values:
            out[field] = values[0]
    return out


def _check_dtype(dtype: str) -> None:
    if dtype not in TORCH_DTYPES:
        raise ZgError(
            f"--dtype {dtype} is not a transformers weights type (hf: {', '.join(DTYPES)})",
            fix="use --dtype f32, f16 or bf16, or --format gguf for q8_0",
        )


def check_hf(student: Path, *, dtype: str = "f32") -> None:
    """Raise a one-line ZgError where ``student`` cannot become a stock folder of ``dtype``; writes nothing."""
    from zgtrain.student.load import check_checksums

    _check_dtype(dtype)
    stock_config(student)
    check_checksums(Path(student))  # tampered weights: refused before anything is written


def export_hf(student: Path, out_dir: Path, *, dtype: str = "f32") -> dict:
    """Write the stock folder of ``student`` into ``out_dir`` (created): config.json of the family's own class,
    the weights in ``dtype`` (safetensors), the tokenizer and generation config. Returns what it wrote."""
    import torch

    from zgdata.families.registry import family_of
    from zgtrain.student.load import load_student

    student, out_dir = Path(student), Path(out_dir)
    _check_dtype(dtype)
    d = stock_config(student)  # the refusals; the weights' checksums are load_student's, before out_dir is made
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    d.pop("torch_dtype", None)
    d["dtype"] = TORCH_DTYPES[dtype]
    model = load_student(student, dtype=torch_dtype)  # checks the pinned code and the weights' checksums
    fam = family_of(d)
    config = fam.config_from_dict(d)
    with torch.device("meta"):
        stock = fam.causal_lm()(config)
    stock.load_state_dict(model.state_dict(), assign=True, strict=False)
    stock.tie_weights()
    missing = [n for n, p in stock.named_parameters() if p.is_meta]
    if missing:  # zg's template and the stock class name every weight alike; a difference is a bug
        raise ZgError(f"the stock {fam.model_class} lacks {missing[:3]} of {student}", fix="report this to zg")
    fam.rebuild_buffers(stock, config)
    out_dir.mkdir(parents=True, exist_ok=True)
    stock.save_pretrained(out_dir)
    for p in sorted(student.iterdir()):  # tokenizer files, generation_config.json: as the student has them
        if p.is_file() and p.name not in _NOT_COPIED and p.suffix not in (".safetensors", ".py"):
            shutil.copyfile(p, out_dir / p.name)
    return {
        "class": fam.model_class,
        "model_type": fam.model_type,
        "layers": config.num_hidden_layers,
        fam.width_attr: d[fam.width_attr],
        "layer_types": d.get("layer_types"),
        "sliding_window": d.get("sliding_window"),
        "trust_remote_code": False,
    }

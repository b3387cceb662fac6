"""A student's tokenizer as llama.cpp reads it: the ``tokenizer.ggml.*`` keys of a GGUF file.

zg students carry a byte-level BPE tokenizer (tokenizer.json: SmolLM2's, Llama 3's, Qwen2's, GPT-2's, or the tiny
teachers' 257-token one from zgdata/teacher/tokenizer.py). It is written as convert_hf_to_gguf.py's
``get_vocab_base`` writes one (``tokenizer.ggml.model = gpt2``): every id's token string (byte-level encoded),
NORMAL / CONTROL (special added tokens) / USER_DEFINED (other added tokens) / UNUSED ([PAD<i>] beyond the
tokenizer) types, the merges, the special ids and whether the tokenizer itself adds BOS / EOS (probed, not
guessed), and the chat template.

The pre-tokenizer type is not guessed either: as ``get_vocab_base_pre`` does, the student's tokenizer encodes a
fixed check text and the sha256 of ``str(ids)`` names llama.cpp's pre-tokenizer. Only the hashes below are
known; any other tokenizer is refused in one line. zg's tiny byte-level tokenizer has no merges, so every
pre-tokenizer split gives one token per byte and llama.cpp's ``default`` pre-tokenizer is exact for it.
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path

from zgdata.errors import ZgError
from zgtrain.fit.rerun import model_of

__all__ = ["CHECK_TEXT", "KNOWN_PRE", "VocabInfo", "read_vocab", "write_vocab"]

# convert_hf_to_gguf.py (conversion/base.py get_vocab_base_pre), verbatim
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# sha256(str(tokenizer.encode(CHECK_TEXT))) -> llama.cpp pre-tokenizer (copied from get_vocab_base_pre, except zg's)
KNOWN_PRE = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM / SmolLM2
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen2
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # GPT-2
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",  # OLMo
    "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e": "dbrx",  # DBRX, OLMo 2
    "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff": "refact",  # Refact, Granite
    # zg's own tiny byte-level tokenizer (zgdata/teacher/tokenizer.py): no merges, one token per byte
    "07e1c926f0e5833bd31ad4ce54099a4d3b2b99754a86eb14a33c60349b0e646e": "default",
}

INERT_MERGE = "[zg:no-merges] [zg:no-merges]"

# gguf.TokenType values (llama.cpp llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


class VocabInfo:
    """What ``write_vocab`` writes, read from the student folder's tokenizer (no pickle: tokenizer.json only)."""

    def __init__(self, tok, pre: str, merges: list[str], n_vocab: int):
        self.tok, self.pre, self.merges, self.n_vocab = tok, pre, merges, n_vocab


def _is_byte_level_bpe(spec: dict) -> bool:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return False
    parts = [spec.get("pre_tokenizer") or {}]
    parts += parts[0].get("pretokenizers") or []
    return any(p.get("type") == "ByteLevel" for p in parts)


def read_vocab(student: Path, n_vocab: int) -> VocabInfo:
    """The student's tokenizer, its llama.cpp pre-tokenizer and merges; ZgError if llama.cpp cannot tokenize as it does."""
    from transformers import AutoTokenizer

    path = Path(student) / "tokenizer.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ZgError(
            f"{path} is missing or unreadable ({e})".split("\n")[0],
            fix=f"rebuild the student with `dvc repro -f {model_of(student).stage}` (it saves the teacher's "
            "tokenizer.json)",
        ) from e
    if not _is_byte_level_bpe(spec):
        kind = (spec.get("model") or {}).get("type")
        raise ZgError(
            f"the student's tokenizer is a {kind} model without a byte-level pre-tokenizer; zg writes only byte-level "
            "BPE tokenizers (SmolLM2, Llama 3, Qwen2, GPT-2 style) to GGUF",
            fix="use `zg export --format hf`, or convert with llama.cpp's convert_hf_to_gguf.py",
        )
    tok = AutoTokenizer.from_pretrained(student, trust_remote_code=False)  # its files only: never a model's code
    digest = sha256(str(tok.encode(CHECK_TEXT)).encode()).hexdigest()
    pre = KNOWN_PRE.get(digest)
    if pre is None:
        raise ZgError(
            f"the student's byte-level BPE pre-tokenizer is not one zg knows for llama.cpp (check-text sha256 "
            f"{digest[:16]}); exporting it under a guessed pre-tokenizer would tokenize differently",
            fix="use `zg export --format hf`, or add its hash and llama.cpp pre-type to KNOWN_PRE in "
            "zgtrain/export/gguf_vocab.py after checking llama.cpp's convert_hf_to_gguf_update.py",
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in (spec["model"].get("merges") or [])]
    if len(tok) > n_vocab:
        raise ZgError(
            f"the student's tokenizer has {len(tok)} tokens but its embedding only {n_vocab} rows",
            fix=f"rebuild the student with `dvc repro -f {model_of(student).stage}`",
        )
    return VocabInfo(tok, pre, merges, n_vocab)


def _adds(tok, which: str) -> bool:
    """Whether the tokenizer itself adds its BOS / EOS token (probed on a plain text, as llama.cpp will be asked)."""
    tid = getattr(tok, f"{which}_token_id")
    if tid is None:
        return False
    with_special = tok("a", add_special_tokens=True)["input_ids"]
    plain = tok("a", add_special_tokens=False)["input_ids"]
    if len(with_special) == len(plain):
        return False
    return (with_special[0] == tid) if which == "bos" else (with_special[-1] == tid)


def write_vocab(writer, info: VocabInfo) -> dict:
    """Write the ``tokenizer.ggml.*`` keys; returns what lineage records."""
    tok = info.tok
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.added_tokens_decoder  # id -> AddedToken
    tokens, types = [], []
    for i in range(info.n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(CONTROL if added[i].special else USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(info.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp requires the merges key and gguf cannot write an empty array: a tokenizer without merges gets
    # one inert merge of two multi-character strings. With no other merge every BPE symbol stays one character,
    # so that pair never occurs and tokenization is unchanged (the tokenization test pins it).
    writer.add_token_merges(info.merges or [INERT_MERGE])
    ids = {}
    for name in ("bos", "eos", "unk", "pad"):
        tid = getattr(tok, f"{name}_token_id", None)
        if tid is not None:
            getattr(writer, f"add_{name}_token_id")(int(tid))
            ids[name] = int(tid)
    add_bos, add_eos = _adds(tok, "bos"), _adds(tok, "eos")
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    template = getattr(tok, "chat_template", None)
    if isinstance(template, str) and template:
        writer.add_chat_template(template)
    return {
        "tokenizer_pre": info.pre,
        "n_tokens": len(tokens),
        "n_merges": len(info.merges),
        "special_ids": ids,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "chat_template": bool(template),
    }

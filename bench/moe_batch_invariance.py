"""Does a token's MoE layer output depend on the rest of its batch? Side by side, on this machine:

- ``F.linear`` of the first M rows of a batch against the same rows of the whole batch, for M = 1..16: where they
  differ, a product of that many rows takes another kernel path and rounds differently;
- one Mixtral-shaped MoE block (router, E experts, top-k) run on a batch of tokens, then on slices of 16 of them (a
  short sequence: the router's own product stays in the many-row regime): the share of tokens whose output differs,
  under transformers' ``grouped_mm``, its ``eager`` loop and zg's padded grouped GEMM
  (zgdata/families/moe_kernel.py, what capture and blocks run);
- the time of a forward under each (best of 3), as a ratio to ``grouped_mm``.

    python bench/moe_batch_invariance.py                    # hidden 1024, expert width 2816, 8 experts, top 2
    python bench/moe_batch_invariance.py --hidden 4096 --width 14336 --tokens 512

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

SLICE = 16


def linear_rows_differ(hidden: int, width: int) -> list[int]:
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(width, hidden, generator=g), torch.randn(64, hidden, generator=g)
    ref = F.linear(x, w)
    return [m for m in range(1, 17) if not torch.equal(F.linear(x[:m], w), ref[:m])]


def experts_module(hidden: int, width: int, experts: int, top_k: int, impl: str):
    import transformers

    from zgdata.families.moe_kernel import register

    register()  # zg's implementation, by name

    cfg = transformers.MixtralConfig(
        hidden_size=hidden, intermediate_size=width, num_local_experts=experts, num_experts_per_tok=top_k
    )
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    return block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--width", type=int, default=2816)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    from zgdata.families.moe_kernel import register

    EXPERTS_IMPLEMENTATION = register()

    differ = linear_rows_differ(args.hidden, args.width)
    print(f"F.linear: the first M rows round differently from the same rows of 64 at M = {differ or 'none'}")
    x = torch.randn(1, args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    out: dict = {"linear_rows_differ": differ}
    times = {}
    for impl in ("grouped_mm", "eager", EXPERTS_IMPLEMENTATION):
        block = experts_module(args.hidden, args.width, args.experts, args.top_k, impl)
        with torch.no_grad():
            whole = block(x)
            alone = torch.cat([block(x[:, i : i + SLICE]) for i in range(0, args.tokens, SLICE)], dim=1)
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                block(x)
                best = min(best, time.perf_counter() - t)
        changed = (alone != whole).any(-1).float().mean().item()
        times[impl] = best
        out[f"{impl}_tokens_changed_in_slices"] = round(changed, 4)
        print(
            f"{impl:24s} tokens whose output changes in slices of {SLICE}: {changed:6.1%}   forward {best * 1e3:7.1f} ms"
        )
    for impl, t in times.items():
        out[f"{impl}_time_vs_grouped_mm"] = round(t / times["grouped_mm"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

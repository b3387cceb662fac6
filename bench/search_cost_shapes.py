"""The cost table's additive prediction at a real teacher's shapes, without training a variant library.

In a project whose teacher is prepared (`zg init --profile search DIR && cd DIR && dvc repro teacher`: the default
SmolLM2-135M), the variants are not trained: each block option is its conversion applied to the teacher's slice
(prune_mlp on a random input sample, drop_layers), which has the variant's real shapes (timing does not depend on
the weights). The cost stage's own code (zgtrain/search/table.py ``measure_table``) times every option beside the
teacher on each runtime; then RANDOM mixes are built the same way and timed end to end beside the teacher
(zgtrain/search/cost.py ``measure_student``), and their measured latency is printed against the table's
prediction. Writes DIR/search/cost/table.json (a scratch project: not a stage's run).

    python bench/search_cost_shapes.py --project DIR --runtimes torch llama.cpp --mixes 4 \\
        --workload '{"prompt": 128, "generate": 32, "repeats": 3}' --out bench/out/search_cost_smollm2.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
from pathlib import Path

VARIANTS = {"p50": {"conversion": "prune_mlp", "prune_ratio": 0.5}, "drop": {"conversion": "drop_layers"}}


def converted_blocks(project, mix: dict, layout, *_, **__) -> list:
    """mix_blocks' result without trained variants: each option converted from the teacher's slice."""
    import torch

    from zgdata.families.registry import config_from_dict
    from zgdata.teacher.prepare import load_slice
    from zgtrain.block.conversions import convert
    from zgtrain.project.config import IDENTITY_VARIANT

    out = []
    for spec in project.partition.blocks():
        tensors, meta = load_slice(layout.teacher_slice(spec.key))
        config = config_from_dict(meta["config"])
        name = mix[spec.key]
        cfg = project.train if name == IDENTITY_VARIANT else project.variants[name]
        n = len(meta["layers"])
        if name == "drop":
            cfg = dataclasses.replace(cfg, keep_layers=list(range(0, n, 2)))
        gen = torch.Generator().manual_seed(0)
        sample = torch.randn(2, 32, config.hidden_size, generator=gen)
        block = convert("identity" if name == IDENTITY_VARIANT else cfg.conversion, tensors, config, cfg, sample, gen)
        out.append((spec, block.eval(), {"state_sha256": None, "fingerprints": {}, "teacher_layers": meta["layers"]}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--runtimes", nargs="+", default=["torch", "llama.cpp"])
    ap.add_argument("--mixes", type=int, default=4)
    ap.add_argument("--workload", default="{}")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out_path = args.out.resolve() if args.out else None
    os.chdir(args.project)
    import zgtrain.search.assemble as assemble
    from zgdata.layout import Layout
    from zgtrain.project.config import IDENTITY_VARIANT, ProjectConfig
    from zgtrain.search.cost import measure_student, predict
    from zgtrain.search.table import measure_table
    from zgtrain.student.assemble import build_from_blocks

    assemble.mix_blocks = converted_blocks  # table.py and this script build every model from conversions
    import yaml

    params = yaml.safe_load(Path("params.yaml").read_text())
    params["variants"] = VARIANTS
    lines = []
    for runtime in args.runtimes:
        params.setdefault("search", {})["workload"] = {**json.loads(args.workload), "runtime": runtime}
        params["search"]["cost"] = "latency"
        project = ProjectConfig.from_params(params)
        layout = Layout()
        table = measure_table(project, layout=layout)
        phase = f"{project.search.served.phase}_ms"
        lines += [
            f"## {runtime}: {table['machine']['kind']}; workload {table['workload']}",
            f"table measured in {table['seconds']:.1f} s; base {table['base'][phase]['median']:.3f} ms",
        ]
        for b, opts in table["blocks"].items():
            lines.append(
                f"{b}: "
                + ", ".join(f"{o} {c[phase]['median']:.3f} ({c[phase]['spread']:.0%})" for o, c in opts.items())
            )
        for o, m in table["models"].items():
            lines.append(
                f"{o} everywhere: measured {m['measured'][phase]['median']:.3f}, predicted "
                f"{m['predicted'][phase]:.3f} ({m['additivity'][phase]:+.1%})"
            )
        rng = random.Random(0)
        options = [IDENTITY_VARIANT, *VARIANTS]
        teacher = build_from_blocks(
            converted_blocks(project, dict.fromkeys(project.blocks, IDENTITY_VARIANT), layout), layout=layout
        )
        for _ in range(args.mixes):
            mix = {b: rng.choice(options) for b in project.blocks}
            model, summary = build_from_blocks(converted_blocks(project, mix, layout), layout=layout)
            m = measure_student(project, layout, {"student": (model, summary), "teacher": teacher}, mix)
            lines.append(
                f"mix {','.join(mix.values())}: measured {m[phase]['measured']['median']:.3f} ms "
                f"(spread {m[phase]['measured']['spread']:.0%}) vs predicted {predict(table, mix, phase):.3f}: "
                f"error {m['error']:+.1%}, teacher drift {m['drift']:+.1%}, relative error {m['relative_error']:+.1%}"
            )
            print(lines[-1], flush=True)
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if out_path:
        out_path.write_text(
            f"$ python bench/search_cost_shapes.py --project DIR --runtimes {' '.join(args.runtimes)} "
            f"--mixes {args.mixes} --workload '{args.workload}'\n\n{text}\n"
        )


if __name__ == "__main__":
    main()

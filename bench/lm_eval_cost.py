"""What `zg train lm-eval` (zg_nextline) costs on the default teacher: seconds per model, per example.

Builds a smollm2 project up to `tokens` (teacher prepare + tokenize: no boundaries, no student), writes the
zg_nextline task from its held-out split and runs lm-eval on the teacher alone, as `zg train lm-eval` does
for each of its two models. The student (0.70 of the teacher's parameters) costs about the same again, so
the stage costs about twice the figure printed here. Not a test.

    python bench/lm_eval_cost.py --workdir /tmp/zgbench-lmeval --limit 40
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from harness import BIN, run, scaffold


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=40, help="examples scored (0: all of lm_eval.examples)")
    args = ap.parse_args()
    root = args.workdir / "proj"
    if not (root / "data" / "tokens.json").exists():
        if not (root / "params.yaml").exists():
            scaffold(root, "smollm2", message=None, capture=False)
        for cmd in (["teacher", "prepare"], ["data", "tokenize"]):
            run([BIN / "zg", *cmd], root, capture=False)
    os.chdir(root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    import lm_eval
    from lm_eval.models.huggingface import HFLM

    from zgdata.layout import Layout
    from zgdata.teacher.prepare import load_teacher
    from zgtrain.evaluate.lm_eval_task import task_config, task_files, write_nextline_task
    from zgtrain.project.config import ProjectConfig

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    cfg = ProjectConfig.load(Path("params.yaml")).lm_eval
    t0 = time.perf_counter()
    meta = write_nextline_task(cfg, Layout())
    t_task = time.perf_counter() - t0
    spec = task_config(str(task_files(Layout())["jsonl"].resolve()), str(Path(".zg/cache/hf_datasets").resolve()), meta)
    model, tok = load_teacher(Layout())
    t1 = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok, batch_size=cfg.batch_size),
        tasks=[spec],
        limit=args.limit or None,
        num_fewshot=0,
        log_samples=False,
        bootstrap_iters=1000,
    )
    t_eval = time.perf_counter() - t1
    n = out["n-samples"]["zg_nextline"]["effective"]
    res = out["results"]["zg_nextline"]
    print(
        f"task: {meta['examples']} examples from {meta['heldout_rows']} held-out rows "
        f"({meta['distractors_from']}) in {t_task:.1f} s"
    )
    print(
        f"teacher: {n} examples x {cfg.choices} choices in {t_eval:.1f} s = {t_eval / n:.2f} s/example; "
        f"acc {res['acc,none']:.3f}, acc_norm {res['acc_norm,none']:.3f} (chance {1 / cfg.choices:.2f})"
    )
    print(
        f"estimate for the stage at {meta['examples']} examples, teacher + student: "
        f"{2 * t_eval / n * meta['examples'] / 60:.1f} min"
    )


if __name__ == "__main__":
    main()

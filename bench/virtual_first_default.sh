#!/usr/bin/env bash
# On the default profile: materialize.virtual_first against the stored h00 of the serial arm that
# `python bench/repro_default.py` leaves in WORKDIR (default /tmp/zgbench-repro). Usage: bench/virtual_first_default.sh [WORKDIR]
# It copies the serial arm, turns virtual_first the other way (on, or off if the arm had it on), reruns materialize + train@b00, then assemble and evaluate,
# and compares b00's state_sha256 and metrics/eval.json (wall-clock fields left out).
set -euo pipefail
cd "$(dirname "$0")/.." && export PATH="$PWD/.venv/bin:$PATH"
W=${1:-/tmp/zgbench-repro}; S=$W/serial V=$W/virt
rm -rf $V && cp -a $S $V && cd $V
S=$S V=$V python - <<'PY'
import yaml
p = yaml.safe_load(open("params.yaml"))
p["materialize"]["virtual_first"] = not p["materialize"].get("virtual_first", False)  # the other way from the serial arm
print("virt arm: materialize.virtual_first =", p["materialize"]["virtual_first"])
open("params.yaml", "w").write(yaml.safe_dump(p, sort_keys=False))
PY
zg pipeline
t0=$(date +%s)
dvc repro train@b00
t1=$(date +%s)
zg train assemble && zg train evaluate
t2=$(date +%s)
echo "dvc repro train@b00: $((t1-t0)) s; assemble+evaluate: $((t2-t1)) s"
ls data/boundaries
S=$S V=$V python - <<'PY'
import json
import os; S, V = os.environ["S"], os.environ["V"]
a = json.load(open(f"{S}/metrics/blocks/b00.json")); b = json.load(open(f"{V}/metrics/blocks/b00.json"))
print("b00 state_sha256", a["state_sha256"][:12], b["state_sha256"][:12], "SAME" if a["state_sha256"] == b["state_sha256"] else "DIFFERENT")
skip = {"seconds", "tokens_per_s"}
ea = {k: v for k, v in json.load(open(f"{S}/metrics/eval.json")).items() if k not in skip}
eb = {k: v for k, v in json.load(open(f"{V}/metrics/eval.json")).items() if k not in skip}
print("eval.json", "SAME" if ea == eb else "DIFFERENT")
if ea != eb:
    for k in ea:
        if ea[k] != eb.get(k): print(k, ea[k], eb.get(k))
PY

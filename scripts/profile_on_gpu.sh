#!/usr/bin/env bash
# Profile the GPU machine's card and host (`reportgen profile-gpu`, twice: the second run shows how far a
# profile repeats), then measure a shard of the validation sweep with what is left of the budget.
# Run ON the GPU machine, from the repo root, with .whl/ carried (scripts/gpu_wheels.sh):
#   REPORTGEN_GIT_COMMIT=<sha> scripts/profile_on_gpu.sh [SHARD] [BUDGET_S]
# Writes into $OUT: profile-1.yaml, profile-2.yaml, profile.log, and what validate_on_gpu.sh writes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SHARD=${1:-1/3}
BUDGET_S=${2:-400}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/profile-site \
  .whl/pydantic-*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
  2>&1 | tail -3
for i in 1 2; do
  PYTHONPATH=/tmp/profile-site:$PWD timeout 150 python3 -m reportgen profile-gpu --out "$OUT/profile-$i.yaml" \
    2>&1 | tee -a "$OUT/profile.log"
done
OUT=$OUT scripts/validate_on_gpu.sh "$SHARD" "$BUDGET_S"

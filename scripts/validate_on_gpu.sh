#!/usr/bin/env bash
# Measure sweeps/validation.yaml on the GPU machine and pack the results for the trip back.
#
# Run ON the GPU machine, from the repo root, after scripts/gpu_wheels.sh filled .whl/ here:
#   REPORTGEN_GIT_COMMIT=<sha> scripts/validate_on_gpu.sh [SHARD] [BUDGET_S]
#     SHARD     I/N: measure only cases whose index is I modulo N (default 0/1: all 49 cases,
#               ~15 min on an H100, too long for one 10-minute call; use 0/3, 1/3, 2/3)
#     BUDGET_S  stop starting cases after this many seconds (default 480): the cases finished
#               by then are packed, the interrupted one is lost, a later call can redo the rest
# Writes into $OUT (or ./out): validation-results.tgz (the result files of the cases measured in
# this call: each holds the estimate and the measurement; merging shards is extracting every
# archive into results/, one file per case) and validate.log.
# The copied tree has no .git: pass the commit the tree is at as REPORTGEN_GIT_COMMIT so every
# measurement records it (git rev-parse HEAD here; REPORTGEN_GIT_DIRTY=1 if the tree had changes).
set -uo pipefail
cd "$(dirname "$0")/.."

SHARD=${1:-0/1}
BUDGET_S=${2:-480}
SWEEP=${SWEEP:-sweeps/validation.yaml}   # another sweep file (tests)
WHEELS=${WHEELS:-.whl}                   # folder of wheels to install into /tmp/site
OUT=${OUT:-$PWD/out}
RESULTS=$(mktemp -d /tmp/validation-results.XXXXXX)
mkdir -p "$OUT"
LOG="$OUT/validate.log"

{
  echo "== validate_on_gpu.sh shard $SHARD budget ${BUDGET_S}s, $(date -u +%FT%TZ), commit ${REPORTGEN_GIT_COMMIT:-unknown}"
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
      || { echo "installing .whl/ failed"; exit 1; }
  else
    echo "no wheels in $WHEELS/: run scripts/gpu_wheels.sh where there is internet and carry .whl"
  fi
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
  python3 - <<'PY' || exit 1
import importlib, sys
for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "torchao", "pynvml", "pydantic",
             "rich", "yaml", "jinja2", "matplotlib", "reportgen"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:13} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # report every missing package, fail only for the essential ones
        print(f"{name:13} MISSING ({type(exc).__name__}: {exc})")
        if name in ("torch", "transformers", "peft", "pydantic", "rich", "yaml", "reportgen"):
            sys.exit(1)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
PY
  # SIGINT at the budget: the sweep kills its running worker and stops; finished cases are on disk
  timeout -s INT -k 30 "$BUDGET_S" \
    python3 -m reportgen sweep "$SWEEP" --measure --no-render --results "$RESULTS" --shard "$SHARD"
  echo "== sweep exit status $? after ${SECONDS}s"
} 2>&1 | tee "$LOG"

# pack only the files that hold a measurement: files of other shards' cases hold estimates only
# and would overwrite measured ones when the archives are merged
python3 - "$RESULTS" > "$RESULTS/measured.txt" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
for path in sorted(root.glob("*/*.json")):
    try:
        if json.loads(path.read_text()).get("measurement"):
            print(path.relative_to(root))
    except ValueError:
        pass
PY
n=$(wc -l < "$RESULTS/measured.txt")
tar -czf "$OUT/validation-results.tgz" -C "$RESULTS" -T "$RESULTS/measured.txt"
echo "== packed $n measured result files into $OUT/validation-results.tgz" | tee -a "$LOG"
python3 - "$RESULTS" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/*.json")):
    m = json.loads(path.read_text()).get("measurement")
    if not m:
        continue
    v = m.get("measurement") or {}
    gib = lambda x: "-" if x is None else f"{x / 2**30:.2f}"
    print(f"{m['status']:>7} {path.stem:55} alloc {gib(v.get('peak_allocated')):>6} GiB  "
          f"step {v.get('step_s') or 0:.3f} s  {(m.get('error') or '').splitlines()[0][:80] if m.get('error') else ''}")
PY

#!/usr/bin/env bash
# Measure sweeps/validation.yaml on the GPU machine and pack the results for the trip back.
#
# Run ON the GPU machine, from the repo root, after scripts/gpu_wheels.sh filled .whl/ here:
#   REPORTGEN_GIT_COMMIT=<sha> scripts/validate_on_gpu.sh [SHARD] [BUDGET_S]
#     SHARD     I/N: measure only cases whose index is I modulo N (default 0/1: all 52 cases,
#               ~25 min on an H100, too long for one 10-minute call; use 0/3, 1/3, 2/3)
#     BUDGET_S  seconds from this script's start (wheels and import check included) after which no
#               case is started (default 540: ~30 s of set-up, ~510 s for a shard of the validation
#               sweep, whose worst case is ~500 s (sweeps/validation.yaml), and a minute left of a
#               10-minute call for the packing); a case is started only if its expected time
#               (reportgen/measure/runner.py expected_s) fits before that deadline, and a worker
#               still running at the deadline is killed without writing a result. Cases left over
#               are listed ("deferred by the deadline"); a later call measures them.
# Writes into $OUT (or ./out): validation-results.tgz (the measurement files, one per measuring
# attempt, <sweep>/measured/<case-id>.<utc>.json: uniquely named and never overwritten, so merging
# shards is extracting every archive into results/; the estimates are recomputed here), validate.log,
# and exits with the sweep's exit status (1 when a case ended in error or timeout: its files are packed all the
# same). With measure.profile, also the profiler traces
# (<sweep>/profiles/<case-id>.<utc>.pt.trace.json.gz; the per-step figures are in the measurement
# files) in validation-profiles.tar, cut into validation-profiles.tar.partNN pieces of 15 MiB when
# larger (`cat validation-profiles.tar.part* | tar -xf - -C results/` joins them).
# SMOKE_K: a pytest -k expression; when set, tests/test_measure_cuda.py's tests that match it run
# first (e.g. SMOKE_K='fused or snapshot or cap or oom': what the sweep does not exercise;
# 'cuda_event or profile': the CUDA-event times and the profile's device figures; 'recipes' or 'cuda'
# for all, about 10 s a test). A failure is logged, the sweep runs all the same; their time counts
# against the budget.
# Resume: measurement files already in results/<sweep name>/measured/ of this tree (extracted from an
# earlier call's archive) are the starting point, so cases measured there (ok or oom, same settings)
# are skipped and a second call of the same shard only measures what is missing.
# The copied tree has no .git: pass the commit the tree is at as REPORTGEN_GIT_COMMIT so every
# measurement records it (git rev-parse HEAD here; REPORTGEN_GIT_DIRTY=1 if the tree had changes).
set -uo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
SHARD=${1:-0/1}
BUDGET_S=${2:-540}
SWEEP=${SWEEP:-sweeps/validation.yaml}   # another sweep file (tests)
WHEELS=${WHEELS:-.whl}                   # folder of wheels to install into $SITE
SITE=${SITE:-/tmp/site}
OUT=${OUT:-$PWD/out}
RESULTS=$(mktemp -d /tmp/validation-results.XXXXXX)
mkdir -p "$OUT"
: > "$RESULTS/seeded.txt"
LOG="$OUT/validate.log"
export REPORTGEN_MEASURE_DEADLINE=$((START + BUDGET_S))

{
  echo "== validate_on_gpu.sh shard $SHARD budget ${BUDGET_S}s, $(date -u +%FT%TZ), commit ${REPORTGEN_GIT_COMMIT:-unknown}"
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    # only what the image lacks, or has older: the image's own newer typing-extensions (say) stays;
    # pydantic and pydantic-core go together (pydantic pins the core's exact version)
    python3 - "$WHEELS" > "$RESULTS/wheels.txt" <<'PY' || { echo "choosing wheels failed"; exit 1; }
import pathlib, sys
from importlib import metadata
from packaging.version import Version
chosen, names = [], {}
for whl in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    key = name.lower().replace("-", "_")
    names[key] = whl
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is not None and Version(have) >= Version(version):
        print(f"  wheel {whl.name}: skipped, the image has {name} {have}", file=sys.stderr)
        continue
    chosen.append(key)
if "pydantic" in chosen and "pydantic_core" in names and "pydantic_core" not in chosen:
    chosen.append("pydantic_core")
for key in chosen:
    print(names[key])
PY
    stamp="$SITE/.reportgen-wheels"
    if [ -s "$RESULTS/wheels.txt" ] && ! cmp -s "$RESULTS/wheels.txt" "$stamp"; then
      xargs -d '\n' python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" < "$RESULTS/wheels.txt" || { echo "installing $WHEELS/ failed"; exit 1; }
      cp "$RESULTS/wheels.txt" "$stamp"
    fi
    sed 's|.*/|  installed |' "$RESULTS/wheels.txt"
  else
    echo "no wheels in $WHEELS/: run scripts/gpu_wheels.sh where there is internet and carry .whl"
  fi
  export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
  env | grep -E '^(PYTORCH_|CUDA_|CUBLAS_|NVIDIA_TF32)' || echo "no PYTORCH_*/CUDA_* variables set"
  python3 - <<'PY' || exit 1
import importlib, sys
for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "torchao", "liger_kernel", "triton",
             "pynvml", "pydantic", "typing_extensions", "rich", "yaml", "jinja2", "matplotlib", "reportgen"):
    try:
        mod = importlib.import_module(name)
        version = getattr(mod, "__version__", None)
        if version is None:
            from importlib import metadata
            dist = {"pynvml": "nvidia-ml-py", "yaml": "pyyaml", "liger_kernel": "liger-kernel"}.get(name, name)
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "?"
        print(f"{name:17} {version}  {getattr(mod, '__file__', '')}")
    except Exception as exc:  # report every missing package, fail only for the essential ones
        print(f"{name:17} MISSING ({type(exc).__name__}: {exc})")
        if name in ("torch", "transformers", "peft", "pydantic", "rich", "yaml", "reportgen"):
            sys.exit(1)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    torch.empty(1, device="cuda")
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name}, total_memory {props.total_memory} bytes ({props.total_memory / 2**20:.0f} MiB)")
    try:  # is device_used per process (nvml-process) or the whole device's (nvml-device)?
        from reportgen.measure.nvml import Nvml, uuid_of
        used, source = Nvml(uuid_of(props)).process_used()
        print(f"nvml: {used} bytes used, source {source}")
    except Exception as exc:  # noqa: BLE001
        print(f"nvml: unavailable ({type(exc).__name__}: {exc})")
PY
  if [ -n "${SMOKE_K:-}" ]; then
    echo "== smoke: pytest tests/test_measure_cuda.py -k '$SMOKE_K'"
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_measure_cuda.py -k "$SMOKE_K" \
      && echo "== smoke passed" || echo "== smoke FAILED (status $?): the sweep runs all the same"
  fi
  # seed the results with the measurements this tree already holds for the sweep (resume, see above)
  name=$(python3 -c 'import sys; from reportgen.sweep import load_sweep; print(load_sweep(sys.argv[1]).name)' "$SWEEP") \
    || { echo "cannot read $SWEEP"; exit 1; }
  if [ -d "results/$name/measured" ]; then
    mkdir -p "$RESULTS/$name/measured" && cp -p results/"$name"/measured/*.json "$RESULTS/$name/measured/" 2>/dev/null
    echo "== seeded $(ls "$RESULTS/$name/measured" | wc -l) measurement files from results/$name/measured"
  fi
  find "$RESULTS" -name '*.json' -path '*/measured/*' | sort > "$RESULTS/seeded.txt"
  left=$((START + BUDGET_S - $(date +%s)))
  echo "== $left s of the budget left for the sweep"
  # the runner stops at REPORTGEN_MEASURE_DEADLINE itself; timeout is only the backstop
  timeout -s INT -k 20 $((left > 0 ? left + 40 : 40)) \
    python3 -m reportgen sweep "$SWEEP" --measure --no-render --results "$RESULTS" --shard "$SHARD"
  status=$?
  echo "== sweep exit status $status after $(( $(date +%s) - START ))s"
  exit $status
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}

# pack the measurement files this call wrote (the seeded ones are back home already); estimates are
# recomputed wherever the archive is extracted
find "$RESULTS" -name '*.json' -path '*/measured/*' | sort | comm -13 "$RESULTS/seeded.txt" - \
  | sed "s|^$RESULTS/||" > "$RESULTS/measured.txt"
n=$(wc -l < "$RESULTS/measured.txt")
tar -czf "$OUT/validation-results.tgz" -C "$RESULTS" -T "$RESULTS/measured.txt"
echo "== packed $n measured result files into $OUT/validation-results.tgz" | tee -a "$LOG"
# profiler traces (already gzipped: a plain tar), in pieces of at most 15 MiB
find "$RESULTS" -name '*.pt.trace.json.gz' -path '*/profiles/*' | sort | sed "s|^$RESULTS/||" > "$RESULTS/traces.txt"
if [ -s "$RESULTS/traces.txt" ]; then
  tar -cf "$OUT/validation-profiles.tar" -C "$RESULTS" -T "$RESULTS/traces.txt"
  if [ "$(stat -c %s "$OUT/validation-profiles.tar")" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15M -d "$OUT/validation-profiles.tar" "$OUT/validation-profiles.tar.part" \
      && rm "$OUT/validation-profiles.tar"
  fi
  echo "== packed $(wc -l < "$RESULTS/traces.txt") profiler traces into $(cd "$OUT" && ls validation-profiles.tar* | tr '\n' ' ')" \
    | tee -a "$LOG"
fi
python3 - "$RESULTS" "$RESULTS/measured.txt" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
for line in pathlib.Path(sys.argv[2]).read_text().split():
    m = json.loads((root / line).read_text())
    v = m.get("measurement") or {}
    gib = lambda x: "-" if x is None else f"{x / 2**30:.2f}"
    spread = "" if v.get("step_s_ci_rel") is None else f" +-{100 * v['step_s_ci_rel']:.1f}%"
    steps = f" {v.get('steps_run')} steps {v.get('stop_reason')}" if v.get("steps_run") else ""
    print(f"{m['status']:>7} {m['id']:55} alloc {gib(v.get('peak_allocated')):>6} GiB  "
          f"step {v.get('step_s') or 0:.3f} s{spread}{steps}  "
          f"{(m.get('error') or '').splitlines()[0][:80] if m.get('error') else ''}")
PY
echo "== done after $(( $(date +%s) - START ))s, exit status $status" | tee -a "$LOG"
exit "$status"

#!/usr/bin/env bash
# Download into .whl/ the wheels the GPU machine lacks, for scripts/validate_on_gpu.sh.
#
# The GPU machine (device kinds nvidia-h100-x1 / nvidia-h200: Python 3.12, x86-64, no internet) has
# torch, transformers, peft, accelerate, nvidia-ml-py, pyyaml, rich, jinja2 and matplotlib
# (/work/.library/device/KINDS.md, "Python packages already there"), but not:
#   bitsandbytes  QLoRA 4-bit layers and the 8-bit optimizers (its wheel carries the CUDA 11.8-13.2 kernels)
#   torchao       CPUOffloadOptimizer for offload=optimizer (0.18 loads its C++ parts only on torch >= 2.11)
#   liger-kernel  loss=fused (chunked linear + cross-entropy; pure Python on the image's Triton)
#   pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions): reportgen imports it
#   trl (+ datasets, dill, multiprocess; the image has pyarrow, pandas, xxhash, fsspec): the trl-sft and
#                 trainer recipes (reportgen/measure/sft.py, sweeps/validation-trl.yaml), about 2 MB
# Run here (with internet), from the repo root:  scripts/gpu_wheels.sh
# .whl/ is gitignored; the device tool carries it with  carry: [".whl"]  (about 50 MB of the 64 MiB a call).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  bitsandbytes==0.50.2
  torchao==0.18.0
  liger-kernel==0.8.5
  pydantic==2.13.4
  pydantic-core==2.46.4
  annotated-types==0.7.0
  typing-inspection==0.4.2
  typing-extensions==4.15.0
  trl==1.16.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
)

rm -rf .whl && mkdir -p .whl
# manylinux_2_24 is needed too: bitsandbytes' wheel is tagged manylinux_2_24_x86_64 only
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"

# one wheel per distribution: two versions of one stop the whole install there
count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "expected ${#WHEELS[@]} wheels in .whl/, found $count:" >&2; ls .whl >&2; exit 1
fi
du -sh .whl
ls -1 .whl

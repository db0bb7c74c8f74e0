#!/usr/bin/env bash
# The learner's GPU check, as one prepared run for a lent H100 or H200 (README.md, "On a lent GPU"): the
# learner's own step on the 1.7B shape (the MFU target) and its peak memory beside the operator's memory plan
# for the same case (the calibration #50 asks for). Prepare here with gpu-wheels.sh, then on the device:
#   run(command="bash benchmarks/learner/gpu-check.sh", carry=[".whl"], timeout_s=600)
# It writes into $OUT (the device's return folder) or, without one, benchmarks/learner/. About 6 minutes.
# GPU_CHECK_ARGS replaces bench.py's arguments (a CPU smoke run: GPU_CHECK_ARGS="--tiny --seq-lens 32 --steps 1").
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-benchmarks/learner}
python=${PYTHON:-python3}
site=$(mktemp -d)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"; } | tee "$out/gpu.txt"
if [ -d .whl ]; then
  # The pinned wheels, then harnessrl itself (no network there: no index, no build isolation, no dependencies).
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  PYTHONPATH="$site" "$python" -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" .
  export PYTHONPATH="$site"
fi
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' | tee -a "$out/gpu.txt"
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
PYTHONUNBUFFERED=1 timeout 540 "$python" benchmarks/learner/bench.py ${GPU_CHECK_ARGS:---shape 1.7b --steps 2} \
  --out "$out/results-gpu-check.json" 2>&1 | tee "$out/gpu-check.log"
rm -rf "$site"

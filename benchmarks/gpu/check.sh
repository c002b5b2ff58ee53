#!/usr/bin/env bash
# The GPU decode path, checked in one go on a machine with an NVIDIA GPU (none was lent while it
# was written; it was dry-run on the CPU provider): export the tiny GLM in fp16, compare it with
# the CPU fp32 graph, measure tokens/s at 1/8/32 streams and host<->device bytes per decode step
# with the KV cache on the device vs copied back each step. Usage (repo root, after
# `make install ACCEL=gpu`): benchmarks/gpu/check.sh [OUT_DIR] [--provider cpu]
set -euo pipefail
OUT=${1:-${OUT:-gpu_check_out}}
shift || true
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1 || true
"$PY" -m deployments.export glm --out "$OUT/glm-fp32" --verify
"$PY" -m deployments.export glm --dtype fp16 --out "$OUT/glm-fp16"
"$PY" -m benchmarks.gpu.check "$OUT/glm-fp32" "$OUT/glm-fp16" "$@" | tee "$OUT/gpu_check.json"

#!/usr/bin/env bash
# The prepared GPU check, for a machine with an NVIDIA GPU and no network (the H200 lent
# through the device tool has torch 2.11, triton 3.6, pytest, hypothesis and scipy, but
# not sglang). From the source tree, no install. Each step has its own time limit and the
# results go to one JSON, OUT_DIR/gpu_check.json (see scripts/gpu_check.py):
#   0. compile: the offline compile check with this machine's Triton (as CI runs it);
#   1. tests on CUDA: kernels vs reference (Triton compiled; dots on tensor cores within
#      tolerance), round cost and warm-up, a real CUDA-graph capture/replay of the query
#      hook, and the int64 test on a 39.6 GB pool (layer stride 1.1e9 elements);
#   2. the kernel benchmark at Qwen3-8B geometry (B=4096, R=64, 1-64 requests), Triton vs
#      the torch reference in the same run;
#   3. compute-sanitizer memcheck on one VaSE round, when the tool is on PATH.
# Usage: scripts/gpu_check.sh [OUT_DIR] [--steps compile,tests,bench,sanitizer]   (~7-10 min on one H200)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-out}}"
shift || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
py=${PYTHON:-python3}
"$py" -c "import torch; assert torch.cuda.is_available(), 'no GPU'" || exit 1
exec "$py" scripts/gpu_check.py "$out" "$@"

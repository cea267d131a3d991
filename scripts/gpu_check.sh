#!/usr/bin/env bash
# One prepared GPU check, for a machine with an NVIDIA GPU and no network (the H200
# lent through the device tool has torch and triton but not sglang).
#   1. the kernel and policy tests on CUDA tensors (Triton compiled, not interpreted);
#   2. the kernel benchmark at Qwen3-8B geometry (Triton vs torch reference, same run).
# It runs from the source tree (no install needed). The SGLang end-to-end tests need
# sglang==0.5.23 installed and are not part of this script.
# Usage: scripts/gpu_check.sh [OUT_DIR]      (~3-6 minutes on one H200)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-out}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
py=${PYTHON:-python3}
"$py" -c "import torch, triton; assert torch.cuda.is_available(), 'no GPU'; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" || exit 1
rc=0
timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_sampling_distribution.py \
  tests/test_policy_properties.py tests/test_config.py 2>&1 | tee "$out/gpu_tests.log" || rc=1
timeout 240 "$py" -m vase_sglang.bench.kernels --json "$out/kernel_bench.json" 2>&1 | tee "$out/kernel_bench.txt" || rc=1
exit $rc

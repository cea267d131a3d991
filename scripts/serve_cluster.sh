#!/usr/bin/env bash
# N vase-sglang workers behind the SGLang gateway (smg, cache-aware routing), on the
# bundled model (or MODEL=path-or-hub-id), on CPU unless DEVICE=cuda. The gateway listens
# on PORT (default 30000).
# Usage: scripts/serve_cluster.sh [N] [-- extra worker flags]     Ctrl-C stops everything.
# Example: scripts/serve_cluster.sh 2 -- --kv-budget 512 --kv-recent 64
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-2}"
shift || true
[ "${1:-}" = "--" ] && shift
bash scripts/setup.sh test >/dev/null   # the test extra carries smg
cd /tmp  # run the installed package, not the checkout
model=(); [ -n "${MODEL:-}" ] && model=(--model "$MODEL")
exec "$OLDPWD/.venv/bin/python" -m vase_sglang.cluster --workers "$n" --device "${DEVICE:-cpu}" "${model[@]}" \
  --port "${PORT:-30000}" --workdir "${WORKDIR:-$OLDPWD/cluster-logs}" -- "$@"

#!/usr/bin/env bash
# Creates .venv and installs vase-sglang (editable) with the named extras.
# Usage: scripts/setup.sh [extra[,extra...]]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
# Quiet unless it fails: a first install prints thousands of lines.
log=$(mktemp)
if ! .venv/bin/python -m pip install --disable-pip-version-check -e "$spec" >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
rm -f "$log"

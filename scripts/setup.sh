#!/usr/bin/env bash
# Creates .venv and installs vase-sglang with the named extras. A regular (not
# editable) install: only a wheel carries the vase_sglang_*.pth files into site-packages.
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
pip=(.venv/bin/python -m pip install --disable-pip-version-check)
# setuptools builds in ./build: a file left there by an earlier build would ship again
# after it was removed or moved in the checkout.
rm -rf build
# First the dependencies (a no-op once present), then always this checkout's code.
if ! { "${pip[@]}" "$spec" && "${pip[@]}" --force-reinstall --no-deps .; } >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
rm -f "$log"

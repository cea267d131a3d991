#!/usr/bin/env bash
# Sets up .venv (first run: ~6 min, ~11 GB for sglang 0.5.23 and torch) and runs the
# whole test suite, end-to-end tests included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
set +e
# Not `python -m pytest`: that would put the checkout on sys.path ahead of the install.
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests (exit 5); refusing to pass an empty run" >&2
  exit 1
fi
exit "$rc"

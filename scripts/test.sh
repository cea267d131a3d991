#!/usr/bin/env bash
# Sets up .venv (first run: ~6 min, ~11 GB for sglang 0.5.23 and torch), checks the
# tree with ruff and mypy (the package and tests/support), and runs the whole test
# suite, the server tests included, then prints the wall time of it all, set-up included.
# Extra arguments go to pytest (docs/testing.md: how to run one layer or marker alone).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
trap 'echo "scripts/test.sh: ${SECONDS} s in all ($((SECONDS / 60)) min $((SECONDS % 60)) s), set-up ${setup_s:-?} s"' EXIT
bash scripts/setup.sh test
setup_s=$SECONDS
set +e
.venv/bin/ruff check .
lint=$?
# The package, and the test support code: its fakes must satisfy the Protocols of
# vase_sglang/plugin/contract.py they stand in for.
.venv/bin/mypy -p vase_sglang && .venv/bin/mypy tests/support
types=$?
# The installed package, as users and servers get it (`python -m pytest tests/unit` from
# the root works too).
# --durations: the slowest tests are named in every run's output, where the time goes.
.venv/bin/pytest --durations=25 "$@"
rc=$?
set -e
if [ "$lint" -ne 0 ] || [ "$types" -ne 0 ]; then
  echo "error: ruff (exit $lint) or mypy (exit $types) failed; pytest exited $rc" >&2
  exit 1
fi
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests (exit 5); refusing to pass an empty run" >&2
  exit 1
fi
exit "$rc"

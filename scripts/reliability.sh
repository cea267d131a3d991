#!/usr/bin/env bash
# Measures the reliability figures the README quotes and writes them under results/:
# the same end-to-end tests CI runs, with VASE_RESULTS set so that each writes its JSON:
#   results/reliability/fuzz-{vase,none}.json  bodies by status, per route (tests/e2e/test_e2e_guards.py)
#   results/reliability/killed-worker.json     what requests in flight on a killed worker got
#   results/gateway/gateway.json               one server vs 2 workers behind smg
#   results/reliability/shutdown.json          SIGTERM to exit during rounds
#   results/reliability/retraction.json        re-prefills and the log-prob match
#   results/reliability/soak-short.json        the 90 s soak (the 30-min one: bench.soak)
#   scripts/reliability.sh          # as in CI (about 10 minutes on 2 cores)
#   scripts/reliability.sh --long   # only the fuzz, with 10x the bodies:
#                                   #   results/reliability/fuzz-{vase,none}-x10.json
# Extra arguments go to pytest. Needs the test environment (scripts/setup.sh test).
set -euo pipefail
cd "$(dirname "$0")/.."
export VASE_RESULTS="$(pwd)/results"
if [ "${1:-}" = "--long" ]; then
  shift
  VASE_FUZZ_SCALE=10 exec .venv/bin/pytest -p no:cacheprovider -s tests/e2e/test_e2e_guards.py "$@"
fi
exec .venv/bin/pytest -p no:cacheprovider -s \
  tests/e2e/test_e2e_guards.py tests/e2e/test_e2e_gateway.py tests/e2e/test_e2e_shutdown.py \
  "tests/e2e/test_e2e_memory.py::test_a_retracted_request_is_evicted_back_to_its_budget_and_matches_the_reference" \
  tests/e2e/test_e2e_soak.py "$@"

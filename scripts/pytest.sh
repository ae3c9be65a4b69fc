#!/usr/bin/env bash
# The suite (or the tests named) in parallel, then the tests that must run alone:
#
#   bash scripts/pytest.sh PYTHON [PYTEST ARGS...]
#
# 1. `pytest -n $PYTEST_WORKERS --dist loadgroup -m "not serial"`: pytest-xdist's workers,
#    sharing the one DynamoDB Local the controller started (tests/conftest.py), a table per
#    test. Most tests wait rather than compute
#    (DynamoDB round trips, lease expiries), so more workers than cores overlap the waits:
#    PYTEST_WORKERS defaults to 4 on this project's 2-core machines (docs/development.md says
#    how it was chosen). The tests of a module with a module-scoped fixture (a server, the docs
#    site, the hosts' network) share one worker (tests/support/xdist_groups.py).
# 2. `pytest -m serial`: the tests marked ``serial``, one at a time on an otherwise idle
#    suite: the @runs_last test that checks every request of the run, and the tests whose
#    timing holds only without seven other processes beside them.
#
# PYTEST_WORKERS=0: everything in one process, in the old order (one invocation, no xdist).
# DYNASEM_TEST_COVERAGE=1: branch coverage of dynasem/ (pytest-cov; worker processes that the
# tests start are measured too: setup.cfg's [coverage:run] patch = subprocess), reported at
# the end and kept in .coverage.
# Exit status: pytest's, the worse of the two; "no test collected" (5) in one half only is
# no failure (a selection with no serial test, or only serial tests).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="$1"
shift
WORKERS="${PYTEST_WORKERS:-4}"

if [ "$WORKERS" = 0 ]; then
    exec "$PY" -m pytest "$@"
fi

cov=()
if [ "${DYNASEM_TEST_COVERAGE:-0}" = 1 ]; then
    rm -f .coverage .coverage.*
    cov=(--cov=dynasem --cov-branch --cov-append --cov-report=)
fi

# The DynamoDB operations dynasem sent, from every process of both halves (conftest.py).
requests="$(mktemp)"
trap 'rm -f "$requests"' EXIT
export DYNASEM_TEST_REQUESTS_FILE="$requests"

"$PY" -m pytest -n "$WORKERS" --dist loadgroup -m "not serial" "${cov[@]}" "$@"
parallel=$?
# Its output is shown unless it found no test (a selection without a serial test): then the
# parallel run's summary stays the last word.
serial_log="$(mktemp)"
trap 'rm -f "$requests" "$serial_log"' EXIT
"$PY" -m pytest -m serial "${cov[@]}" "$@" >"$serial_log" 2>&1
serial=$?
if [ "$serial" = 5 ]; then
    echo "scripts/pytest.sh: no test marked serial in this selection"
else
    cat "$serial_log"
fi

if [ "${#cov[@]}" != 0 ]; then
    echo "coverage of dynasem/ (branches included): $("$PY" -m coverage report --format=total --precision=1)%"
fi

if [ "$parallel" = 5 ] && [ "$serial" = 5 ]; then exit 5; fi
if [ "$parallel" = 5 ]; then parallel=0; fi
if [ "$serial" = 5 ]; then serial=0; fi
if [ "$parallel" != 0 ]; then exit "$parallel"; fi
exit "$serial"

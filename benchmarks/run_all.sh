#!/usr/bin/env bash
# Runs the five comparative benchmarks (cost.py: capacity units and dollars) one after the other:
#
#     benchmarks/run_all.sh [--no-doc]
#
# Each script starts (and stops) its own DynamoDB Local; this script starts nothing itself.
# It installs the peer library (python-dynamodb-lock, benchmarks only) into .venv when it is
# missing, passes its arguments to every script (--no-doc: leave docs/BENCHMARKS.md alone),
# prints every missed target again at the end, and exits non-zero only if a script crashed
# (a missed target is printed as MISSED, never an error).
set -u
cd "$(dirname "$0")/.."

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    echo "run_all.sh: $PY not found: run 'make venv' first" >&2
    exit 2
fi
if ! "$PY" -c "import python_dynamodb_lock" 2>/dev/null; then
    echo "run_all.sh: installing python-dynamodb-lock into .venv (benchmarks only)"
    "$PY" -m pip install --quiet python-dynamodb-lock || exit 2
fi

export PYTHONUNBUFFERED=1
logdir=$(mktemp -d "${TMPDIR:-/tmp}/dynasem-bench.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
crashed=()
started=$SECONDS
for name in uncontended cycle_profile contended many_resources reap_and_list cost telemetry; do
    echo
    echo "=== benchmarks/$name.py"
    t0=$SECONDS
    "$PY" "benchmarks/$name.py" "$@" 2>&1 | tee "$logdir/$name.log"
    rc=${PIPESTATUS[0]}
    echo "=== benchmarks/$name.py: exit $rc after $((SECONDS - t0)) s"
    if [ "$rc" -ne 0 ]; then
        crashed+=("$name (exit $rc)")
    fi
done

echo
echo "=== summary ($((SECONDS - started)) s)"
missed=0
for name in uncontended cycle_profile contended many_resources reap_and_list cost telemetry; do
    while IFS= read -r line; do
        echo "$name: $line"
        missed=$((missed + 1))
    done < <(grep -E '^target MISSED' "$logdir/$name.log" || true)
done
if [ "$missed" -eq 0 ] && [ "${#crashed[@]}" -eq 0 ]; then
    echo "every target met"
elif [ "$missed" -eq 0 ]; then
    echo "no MISSED target in the scripts that completed"
else
    echo "MISSED: $missed target(s) (listed above)"
fi
if [ "${#crashed[@]}" -ne 0 ]; then
    echo "CRASHED: ${crashed[*]}" >&2
    exit 1
fi
exit 0

#!/usr/bin/env bash
# Print a runnable interpreter for Python X.Y (the first found of several), or fail.
#
#   bash scripts/find_python.sh 3.11            # -> python3.11, or ~/.pyenv/versions/3.11.7/bin/python3.11
#   bash scripts/find_python.sh 3.13 3.12 3.11  # the newest of these that is here
#
# Looks on PATH first, then in pyenv's versions folder. A pyenv shim of a version that is not
# selected is on PATH but fails when run, so each candidate is run, not only found.
set -euo pipefail

for v in "$@"; do
    if command -v "python$v" >/dev/null 2>&1 && "python$v" -c "" >/dev/null 2>&1; then
        echo "python$v"
        exit 0
    fi
    found=""
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
        if [ -x "$candidate" ] && "$candidate" -c "" >/dev/null 2>&1; then
            found="$candidate"  # the glob sorts, so the last is the newest patch release
        fi
    done
    if [ -n "$found" ]; then
        echo "$found"
        exit 0
    fi
done
echo "find_python.sh: none of Python $* found (on PATH or under pyenv)" >&2
exit 1

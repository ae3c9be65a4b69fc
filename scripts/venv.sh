#!/usr/bin/env bash
# Create or refresh the development virtualenv in .venv (idempotent).
#
#   bash scripts/venv.sh        # used by `make test`, `make demo`, `make lint`
#
# Creates .venv with `python3 -m venv` if it is missing, upgrades pip and installs the project
# in editable mode with its `test` and `demo` extras. A stamp file records a successful install;
# while it is newer than setup.cfg and pyproject.toml, re-runs skip pip entirely.
# Set PYTHON to use another interpreter (default: python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.dynasem-installed"

if [ ! -x "$VENV/bin/python" ]; then
    echo "venv.sh: creating $VENV with $PYTHON -m venv"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi

if [ -f "$STAMP" ] && [ "$STAMP" -nt setup.cfg ] && [ "$STAMP" -nt pyproject.toml ]; then
    echo "venv.sh: $VENV is up to date (stamp newer than setup.cfg); skipping pip install"
    exit 0
fi

echo "venv.sh: upgrading pip in $VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip

echo "venv.sh: pip install -e \".[test,demo]\""
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -e ".[test,demo]"

touch "$STAMP"
echo "venv.sh: done ($("$VENV/bin/python" --version))"

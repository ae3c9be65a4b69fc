#!/usr/bin/env bash
# Install the built wheel (not editable) into a fresh venv and use it as a project would
# (scripts/wheel_check/check.py): admin pages, every template, a lock taken and released.
#
#   bash scripts/wheel_check.sh [PYTHON] [DJANGO_REQUIREMENT] [EXTRAS]
#   bash scripts/wheel_check.sh 3.11 "django==4.2.*"       # X.Y: found by find_python.sh
#   bash scripts/wheel_check.sh 3.12 "django" testing,otel  # with opentelemetry-api
#
# Needs one dist/dynasem-*.whl (`make dist`). PYTHON defaults to .venv's (the newest
# supported), DJANGO_REQUIREMENT to the newest Django pip finds for it. The wheel is installed
# with its `testing` extra (moto, for the embedded engine). An editable install would hide
# missing package data: that is what this check is for.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

PYTHON="${1:-.venv/bin/python}"
if [[ "$PYTHON" =~ ^[0-9]+\.[0-9]+$ ]]; then
    PYTHON="$(bash scripts/find_python.sh "$PYTHON")"
fi
DJANGO="${2:-django}"
EXTRAS="${3:-testing}"

shopt -s nullglob
wheels=(dist/dynasem-*.whl)
if [ "${#wheels[@]}" != 1 ]; then
    echo "wheel_check.sh: expected one dist/dynasem-*.whl, found ${#wheels[@]} (run make dist)" >&2
    exit 1
fi
wheel="$REPO/${wheels[0]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --without-pip would be faster, but the venv needs pip to install the wheel.
# uv (the dev group's, in .venv) installs the same wheel by the same metadata in seconds
# where pip takes a minute per venv; pip where there is no uv.
UV="$REPO/.venv/bin/uv"
if [ -x "$UV" ]; then
    "$UV" venv --quiet --python "$PYTHON" "$work/venv"
    echo "wheel_check.sh: uv pip install ${wheels[0]}[$EXTRAS] \"$DJANGO\" into a fresh $("$work/venv/bin/python" --version) venv"
    "$UV" pip install --quiet --python "$work/venv/bin/python" "$wheel[$EXTRAS]" "$DJANGO"
else
    "$PYTHON" -m venv "$work/venv"
    echo "wheel_check.sh: pip install ${wheels[0]}[$EXTRAS] \"$DJANGO\" into a fresh $("$work/venv/bin/python" --version) venv"
    "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$wheel[$EXTRAS]" "$DJANGO"
fi

# From an empty folder, so nothing of the checkout is importable but what check.py loads.
cd "$work"
"$work/venv/bin/python" "$REPO/scripts/wheel_check/check.py" "$REPO"

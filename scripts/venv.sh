#!/usr/bin/env bash
# Create or refresh the development virtualenv in .venv (idempotent).
#
#   bash scripts/venv.sh        # used by `make test`, `make demo`, `make lint`, ...
#
# `make test` is the quick full run on the newest supported pair, so .venv is built with the
# newest supported Python found (3.13, then 3.12, then 3.11: on PATH, else under pyenv's
# versions folder) and the installer picks the newest Django for it. Set PYTHON to use another
# interpreter. A .venv built with another Python X.Y than the one chosen is rebuilt.
#
# Installs the project in editable mode with its `demo` and `testing` extras and the `dev`
# dependency group (pyproject.toml), with uv (pip where uv cannot be installed). A stamp file
# records a successful install; while it is newer than pyproject.toml (and the venv's Python is
# the one chosen), re-runs skip the install.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
STAMP="$VENV/.dynasem-installed"
SUPPORTED="3.13 3.12 3.11"

runs() { "$1" -c "import sys; sys.exit(sys.version_info < (3, 11))" >/dev/null 2>&1; }

PYTHON="${PYTHON:-$(bash scripts/find_python.sh $SUPPORTED 2>/dev/null || echo python3)}"
if ! runs "$PYTHON"; then
    echo "venv.sh: $PYTHON is missing or older than 3.11 (dynasem needs Python >= 3.11)" >&2
    exit 1
fi
want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

if [ -x "$VENV/bin/python" ]; then
    have="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' || true)"
    if [ "$have" != "$want" ]; then
        echo "venv.sh: $VENV has Python ${have:-?}, rebuilding it with $PYTHON ($want)"
        rm -rf "$VENV"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "venv.sh: creating $VENV with $PYTHON -m venv"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi

# mysqlclient, Django's MySQL driver, for tests/transactions/test_fenced_mariadb.py: it compiles against
# libmariadb-dev (found through pkg-config), which .ci/run installs and a fresh machine may
# lack. Where it cannot be built the venv is made without it and that module skips, saying so.
mysqlclient() {
    if "$VENV/bin/python" -c "import MySQLdb" >/dev/null 2>&1; then return 0; fi
    if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libmariadb; then
        echo "venv.sh: pip install mysqlclient (tests/transactions/test_fenced_mariadb.py)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "mysqlclient>=2.2.1" \
            || echo "venv.sh: mysqlclient did not build; tests/transactions/test_fenced_mariadb.py will skip"
    else
        echo "venv.sh: no libmariadb-dev/pkg-config: tests/transactions/test_fenced_mariadb.py will skip" \
            "(apt-get install libmariadb-dev pkg-config, then make venv)"
    fi
}

if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then
    echo "venv.sh: $VENV is up to date (stamp newer than pyproject.toml); skipping pip install"
    mysqlclient
    exit 0
fi

# uv installs what pip would (the same versions), in seconds where pip takes a minute (ci64:
# 63 s for this step); it is the dev group's already (nox's backend). Bytecode is compiled
# now, as pip does: where PYTHONDONTWRITEBYTECODE is set (these machines), every process of
# the suite would compile what it imports (ci65, without: make test 729 -> 873 s). pip is the
# way where uv cannot be had, or cannot install (it reads no pip.conf: an index or wheel
# folder only pip is told of).
with_uv() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "uv>=0.5" || return 1
    echo "venv.sh: uv pip install --compile-bytecode -e \".[demo,testing]\" --group dev"
    "$VENV/bin/uv" pip install --compile-bytecode --python "$VENV/bin/python" \
        -e ".[demo,testing]" --group dev
}
with_pip() {
    # pip >= 25.1 reads dependency groups (--group).
    echo "venv.sh: upgrading pip in $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25.1"
    echo "venv.sh: pip install -e \".[demo,testing]\" --group dev"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
        -e ".[demo,testing]" --group dev
}
if ! with_uv; then
    echo "venv.sh: uv could not install the venv; pip does"
    with_pip
fi

mysqlclient
touch "$STAMP"
echo "venv.sh: done ($("$VENV/bin/python" --version), Django $("$VENV/bin/python" -m django --version))"

#!/usr/bin/env bash
# Check the built sdist: it holds every tracked file of the package and of tests/ (so the
# suite runs from it), and part of the suite runs from the unpacked folder.
#
#   bash scripts/sdist_check.sh [PYTEST ARGS...]   # default: a Django-facing sample
#
# Needs one dist/dynasem-*.tar.gz (`make dist`), a git checkout (for the list of tracked
# files) and .venv (its pytest, Django, moto). The tests import dynasem from the unpacked
# folder, not the checkout (pytest's `pythonpath = .`, setup.cfg). DynamoDB Local comes from
# the checkout's .cache/ through a symlink, not a second npm install.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
PY="$REPO/.venv/bin/python"

shopt -s nullglob
sdists=(dist/dynasem-*.tar.gz)
if [ "${#sdists[@]}" != 1 ]; then
    echo "sdist_check.sh: expected one dist/dynasem-*.tar.gz, found ${#sdists[@]} (run make dist)" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "${sdists[0]}" -C "$work"
unpacked=("$work"/dynasem-*)
root="${unpacked[0]}"

missing=0
while IFS= read -r file; do
    if [ ! -e "$root/$file" ]; then
        echo "sdist_check.sh: ${sdists[0]} lacks $file" >&2
        missing=1
    fi
done < <(git ls-files dynasem tests LICENSE README.md CHANGELOG.md pyproject.toml setup.cfg noxfile.py)
if [ "$missing" = 1 ]; then
    exit 1
fi
echo "sdist_check.sh: ${sdists[0]} holds all $(git ls-files dynasem tests | wc -l) tracked files of dynasem/ and tests/"

mkdir -p "$REPO/.cache"
ln -s "$REPO/.cache" "$root/.cache"
cd "$root"
where="$("$PY" -c 'import sys; sys.path.insert(0, "."); import dynasem; print(dynasem.__file__)')"
case "$where" in
    "$root"/*) echo "sdist_check.sh: the tests import $where" ;;
    *)
        echo "sdist_check.sh: dynasem would come from $where, not the sdist" >&2
        exit 1
        ;;
esac
if [ "$#" = 0 ]; then
    # The admin's templates from an installed package: the wheel check renders every one.
    set -- tests/app/test_checks.py tests/app/test_conf.py tests/engine/test_decorators.py
fi
"$PY" -m pytest -q -p no:cacheprovider "$@"

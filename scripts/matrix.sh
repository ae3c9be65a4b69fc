#!/usr/bin/env bash
# `make matrix`: the nox sessions tagged ci (every (Python, Django) pair but the newest), in
# MATRIX_JOBS groups at once (default 2). Each session starts its own DynamoDB Local on a free
# port, so the groups share nothing but the machine. On 2 cores two groups take about 55 % of
# the time one after another does (1,010 s against ~1,900 s on 2026-11-26): a session spends
# much of its time waiting on DynamoDB Local and on its own sleeps, not on a core.
#
# The venvs are made and installed first, one session after another (uv and pip share caches;
# installing from two processes at once only saves seconds), then the groups run with -R
# (reuse, no install). Each group's output goes to .nox/matrix-N.log and is printed whole when
# the group ends, so two sessions never interleave their lines. Exit status: 0 only if every
# group passed.
#
#   bash scripts/matrix.sh .venv/bin/python [NOX_ARGS...]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="$1"
shift
JOBS="${MATRIX_JOBS:-2}"

# Each line: a group number, a tab, a session. A "full" session runs the Django-facing part
# (about four times a smoke session's minutes): the longest first, each to the group with the
# least work so far, so the groups end together.
mapfile -t SESSIONS < <("$PY" -m nox -l -t ci --json 2>/dev/null | "$PY" -c '
import json, sys
jobs = int(sys.argv[1])
found = [s for s in json.load(sys.stdin) if "ci" in s.get("tags", [])]
work = [0] * jobs
for s in sorted(found, key=lambda s: "full" not in s.get("tags", [])):
    g = work.index(min(work))
    work[g] += 4 if "full" in s.get("tags", []) else 1
    print(g, s["session"], sep="\t")
' "$JOBS")
if [ "${#SESSIONS[@]}" = 0 ]; then
    echo "scripts/matrix.sh: nox lists no session tagged ci" >&2
    exit 1
fi
echo "scripts/matrix.sh: ${#SESSIONS[@]} sessions in $JOBS groups at once"

"$PY" -m nox -t ci --install-only "$@"

mkdir -p .nox
pids=()
for ((g = 0; g < JOBS; g++)); do
    group=()
    for line in "${SESSIONS[@]}"; do
        if [ "${line%%$'\t'*}" = "$g" ]; then group+=("${line#*$'\t'}"); fi
    done
    [ "${#group[@]}" = 0 ] && continue
    log=".nox/matrix-$g.log"
    echo "scripts/matrix.sh: group $g -> $log: ${group[*]}"
    "$PY" -m nox -R -s "${group[@]}" "$@" >"$log" 2>&1 &
    pids+=("$!:$g")
done

failed=0
for entry in "${pids[@]}"; do
    pid="${entry%%:*}"
    g="${entry##*:}"
    if wait "$pid"; then status=passed; else status=FAILED; failed=1; fi
    echo
    echo "scripts/matrix.sh: ==== group $g $status ===="
    cat ".nox/matrix-$g.log"
done
exit "$failed"

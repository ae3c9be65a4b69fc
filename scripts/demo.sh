#!/usr/bin/env bash
# Run the example project at http://127.0.0.1:${DEMO_PORT:-8000}/ (login demo / demo).
#
#   make demo                    # sets up .venv first, then runs this
#   DEMO_PORT=8080 make demo
#
# DynamoDB: the endpoint configured in the environment or .env (DYNASEM_ENDPOINT_URL) if any;
# otherwise an embedded in-memory server (dynasem/testing/embedded.py) on a free
# port, stopped when this script exits. DEMO_AWS=1 skips it and uses AWS itself with your
# usual boto3 credentials. Safe to run again: every step is idempotent.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Not $PYTHON: scripts/venv.sh reads that as the interpreter to build .venv with.
PY="${DEMO_PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null; then
    echo "demo.sh: $PY not found; run \`make demo\` (or \`make venv\` first)" >&2
    exit 1
fi
export DJANGO_SETTINGS_MODULE=example_project.settings
PORT="${DEMO_PORT:-8000}"

workdir="$(mktemp -d)"
server_pid=""
worker_pid=""
cleanup() {
    if [ -n "$worker_pid" ]; then
        kill "$worker_pid" 2>/dev/null || true
        wait "$worker_pid" 2>/dev/null || true
    fi
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$workdir"
}
trap cleanup EXIT
# Ctrl-C/TERM: exit (which runs cleanup once) instead of carrying on with the next step.
trap 'exit 130' INT
trap 'exit 143' TERM

# What the app will see, .env included: "<endpoint or -> <keys set: 0/1> <region set: 0/1>".
# Importing the settings module alone reads .env into os.environ, as manage.py will.
settings_summary="$("$PY" -c '
import os
from example_project import settings
env = os.environ.get
print(
    settings.DYNASEM["ENDPOINT_URL"] or "-",
    int(bool(env("AWS_ACCESS_KEY_ID") or env("AWS_PROFILE"))),
    int(bool(settings.DYNASEM["REGION_NAME"] or env("AWS_REGION") or env("AWS_DEFAULT_REGION"))),
    int(settings.DEMO_TASKS_WORKER),
)
')" || { echo "demo.sh: could not load example_project.settings (see above)" >&2; exit 1; }
read -r configured_endpoint have_keys have_region tasks_worker <<<"$settings_summary"

if [ "$configured_endpoint" != "-" ]; then
    echo "demo.sh: using DynamoDB at $configured_endpoint (DYNASEM_ENDPOINT_URL)"
    local_engine=1
elif [ "${DEMO_AWS:-0}" = 1 ]; then
    echo "demo.sh: using AWS DynamoDB (DEMO_AWS=1) with boto3's usual credentials"
    local_engine=0
else
    "$PY" -m dynasem.testing --port 0 --port-file "$workdir/port" --quiet \
        >"$workdir/dynamodb.log" 2>&1 &
    server_pid=$!
    # Bound to port 0 and told us the port: no window in which another program takes it.
    for _ in $(seq 100); do
        [ -s "$workdir/port" ] && break
        if ! kill -0 "$server_pid" 2>/dev/null; then
            cat "$workdir/dynamodb.log" >&2
            echo "demo.sh: the embedded DynamoDB server did not start" >&2
            exit 1
        fi
        sleep 0.1
    done
    if [ ! -s "$workdir/port" ]; then
        echo "demo.sh: the embedded DynamoDB server did not start within 10 s" >&2
        exit 1
    fi
    DYNASEM_ENDPOINT_URL="http://127.0.0.1:$(cat "$workdir/port")"
    export DYNASEM_ENDPOINT_URL
    echo "demo.sh: started an embedded in-memory DynamoDB at $DYNASEM_ENDPOINT_URL"
    local_engine=1
fi

if [ "$local_engine" = 1 ]; then
    # A local engine accepts any keys, but boto3 will not sign a request without some (and
    # would first go looking for them, EC2 metadata service included). Only when none are
    # set in the environment or .env, nor a profile chosen: those are left alone.
    if [ "$have_keys" = 0 ]; then
        export AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo
    fi
    # Local engines keep one set of tables per region: pin one only if nothing names it.
    if [ "$have_region" = 0 ]; then
        export AWS_DEFAULT_REGION=us-east-1
    fi
fi

"$PY" manage.py migrate --noinput --verbosity 0

# Non-interactive and only if missing, so a second run keeps the user (and its password).
"$PY" manage.py shell --verbosity 0 -c '
from django.contrib.auth import get_user_model
User = get_user_model()
if not User.objects.filter(username="demo").exists():
    User.objects.create_superuser("demo", "demo@example.com", "demo")
    print("demo.sh: created the superuser demo / demo")
'

"$PY" manage.py dynasem_createtable --wait

# The background rebuilds' worker (django-tasks-db), when the settings store tasks in the
# database (DEMO_TASKS_WORKER); its log goes to the terminal with runserver's.
if [ "$tasks_worker" = 1 ]; then
    "$PY" manage.py db_worker --interval 0.5 --verbosity 1 &
    worker_pid=$!
    echo "demo.sh: started a task worker (manage.py db_worker) for the background rebuilds"
fi

cat <<EOF

  dynasem demo:  http://127.0.0.1:$PORT/
  log in as:     demo / demo
  held locks:    http://127.0.0.1:$PORT/admin/dynasem/lock/
  (Ctrl-C stops the demo$([ -n "$server_pid" ] && echo " and the embedded DynamoDB"))

EOF

# Not exec: this shell stays to stop the embedded server when runserver ends.
"$PY" manage.py runserver "127.0.0.1:$PORT"

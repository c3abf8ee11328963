#!/bin/sh
# The first ten minutes, timed: a fresh clone of this repository, `make run` in it, and the
# README's second-terminal commands run from another directory, until the first run succeeds.
#
#   bench/first_run.sh [warm|cold ...]     (default: warm cold)
#
# warm: pip's usual cache; cold: an empty PIP_CACHE_DIR, so every wheel is downloaded.
# Prints one line per mode: clone, `make run` -> API listening, and clone -> first succeeded
# run, in seconds. Uses a temporary directory and a free port; leaves nothing running.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd)
MODES=${*:-warm cold}

now() { python3 -c 'import time; print(f"{time.monotonic():.2f}")'; }
elapsed() { python3 -c "print(f'{$2 - $1:.1f}')"; }
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

measure() {
    mode=$1
    work=$(mktemp -d /tmp/psfirst-XXXXXX)
    port=$(free_port)
    export PROMPTSCHED_DATA_DIR="$work/data" PROMPTSCHED_HTTP_PORT="$port"
    unset PROMPTSCHED_DATABASE_URL || true
    if [ "$mode" = cold ]; then export PIP_CACHE_DIR="$work/pip-cache"; else unset PIP_CACHE_DIR || true; fi

    start=$(now)
    git clone --quiet "$REPO" "$work/clone"
    cloned=$(now)
    # setsid: its own process group, so the whole `make run` tree is stopped at the end.
    (cd "$work/clone" && setsid make run >"$work/make.log" 2>&1) &
    make_pid=$!
    listening=""
    deadline=$(( $(date +%s) + 600 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then listening=$(now); break; fi
        if ! kill -0 "$make_pid" 2>/dev/null; then break; fi
        sleep 0.2
    done
    if [ -z "$listening" ]; then
        echo "$mode: make run did not listen; its log:" >&2; tail -20 "$work/make.log" >&2; exit 1
    fi

    cli="$work/clone/.venv/bin/promptsched"
    (cd "$work" && "$cli" schedules add --name first --every 1s --prompt "Hello" >/dev/null)
    succeeded=""
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if (cd /tmp && "$cli" runs list --status succeeded --json) | grep -q '"id"'; then
            succeeded=$(now); break
        fi
        sleep 0.2
    done

    pgid=$(ps -o pgid= -p "$make_pid" 2>/dev/null | tr -d ' ' || true)
    [ -n "$pgid" ] && kill -TERM "-$pgid" 2>/dev/null || true
    wait "$make_pid" 2>/dev/null || true
    if [ -z "$succeeded" ]; then echo "$mode: no run succeeded in time" >&2; exit 1; fi
    venv=$(du -sm "$work/clone/.venv" | cut -f1)
    echo "$mode: clone $(elapsed "$start" "$cloned") s," \
         "make run -> API listening $(elapsed "$cloned" "$listening") s," \
         "clone -> first succeeded run $(elapsed "$start" "$succeeded") s," \
         "venv ${venv} MB"
    rm -rf "$work"
}

for mode in $MODES; do measure "$mode"; done

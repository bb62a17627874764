#!/usr/bin/env bash
# Local Airflow stack: api-server, scheduler, triggerer and dag-processor as 4 background processes,
# each in its own session / process group (setsid).
#
# Usage: scripts/airflow_stack.sh up [--no-wait] | down | status [--wait] | restart
#
#   up       start whatever is not running (idempotent: a live pidfile is left alone), then wait
#            until GET /api/v2/monitor/health reports the metadatabase, scheduler, triggerer and
#            dag_processor healthy. Exit 1 (with log tails) when a component dies or time runs out.
#   down     TERM each process group, KILL it after $TANDEM_STACK_STOP_TIMEOUT s, remove pidfiles
#   status   print pid / liveness per component and the health endpoint's view;
#            exit 0 only when all 4 run and are healthy. --wait: wait for that first.
#
# Environment honoured (set before calling; everything else comes from .tandem/env.sh):
#   AIRFLOW_HOME          Airflow home of this stack (default <project>/.tandem/airflow). A caller
#                         value wins over env.sh (TANDEM_AIRFLOW_HOME does the same); the metadata DB
#                         then defaults to $AIRFLOW_HOME/airflow.db and is migrated on first `up`.
#   TANDEM_AIRFLOW_PORT   API server port (default 8080); the scheduler's and triggerer's log
#                         servers use port+713 and port+714.
#   TANDEM_AIRFLOW_HOST   address the API server listens on (default 127.0.0.1; 0.0.0.0 for workers
#                         on other hosts, see README "Deploying on several hosts")
#   TANDEM_AIRFLOW_DB_URL Airflow metadata DB URL (default SQLite in AIRFLOW_HOME)
#   TANDEM_DAGS_FOLDER    DAG folder (default <project>/dags)
#   TANDEM_ENV_FILE       env file to source (default <project>/.tandem/env.sh; `make setup` writes it)
#   TANDEM_STACK_TIMEOUT  seconds `up` / `status --wait` wait for health (default 120)
#   TANDEM_STACK_STOP_TIMEOUT  seconds `down` waits after TERM before KILL (default 20)
# Files: pidfiles $AIRFLOW_HOME/run/<component>.pid, logs $AIRFLOW_HOME/logs/stack/<component>.log
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_FILE="${TANDEM_ENV_FILE:-$ROOT/.tandem/env.sh}"
COMPONENTS=(api-server scheduler triggerer dag-processor)

log() { printf '[airflow_stack] %s\n' "$*" >&2; }
die() { printf '[airflow_stack] ERROR: %s\n' "$*" >&2; exit 1; }

[[ -f "$ENV_FILE" ]] || die "$ENV_FILE not found: run 'make setup' first"
# The caller's AIRFLOW_HOME (e.g. a test's temp dir) wins over the project default.
if [[ -z "${TANDEM_AIRFLOW_HOME:-}" && -n "${AIRFLOW_HOME:-}" ]]; then
    export TANDEM_AIRFLOW_HOME="$AIRFLOW_HOME"
fi
# shellcheck source=/dev/null
. "$ENV_FILE"

AIRFLOW_BIN="$TANDEM_HOME/.venv/bin/airflow"
PYTHON="$TANDEM_HOME/.venv/bin/python"
[[ -x "$AIRFLOW_BIN" ]] || die "$AIRFLOW_BIN not found: run 'make setup' first"
PORT="$TANDEM_AIRFLOW_PORT"
RUN_DIR="$AIRFLOW_HOME/run"
LOG_DIR="$AIRFLOW_HOME/logs/stack"
HEALTH_URL="http://127.0.0.1:$PORT/api/v2/monitor/health"
TIMEOUT="${TANDEM_STACK_TIMEOUT:-120}"
STOP_TIMEOUT="${TANDEM_STACK_STOP_TIMEOUT:-20}"

pidfile() { echo "$RUN_DIR/$1.pid"; }

# component_pid NAME -> prints the pid when its pidfile points at a live airflow process of that name
component_pid() {
    local f pid
    f="$(pidfile "$1")"
    [[ -f "$f" ]] || return 1
    pid="$(cat "$f" 2>/dev/null)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # guard against pid reuse: the process must still be this airflow component (airflow renames
    # some processes with setproctitle, e.g. "airflow api_server -- host:...")
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq -- "airflow ${1//-/[-_]}( |$)" || return 1
    [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != "Z" ]] || return 1
    echo "$pid"
}

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# health_json -> prints the health endpoint's JSON, or fails
health_json() {
    curl -fsS --max-time 5 "$HEALTH_URL" 2>/dev/null
}

# health_summary JSON -> "metadatabase=healthy scheduler=healthy ..." ; exit 0 when all healthy
health_summary() {
    "$PYTHON" -c '
import json, sys
try:
    h = json.loads(sys.argv[1])
except Exception:
    print("unreadable health response"); sys.exit(1)
parts, ok = [], True
for key in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
    status = (h.get(key) or {}).get("status")
    parts.append(f"{key}={status}")
    ok = ok and status == "healthy"
print(" ".join(parts))
sys.exit(0 if ok else 1)
' "$1"
}

port_in_use() {
    "$PYTHON" -c '
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
' "$1"
}

ensure_airflow_home() {
    mkdir -p "$AIRFLOW_HOME" "$RUN_DIR" "$LOG_DIR"
    "$TANDEM_HOME/.venv/bin/tandem" airflow-login --ensure | while IFS= read -r line; do log "$line"; done
    # Same stamp as scripts/setup.sh: migrate once per metadata DB URL + Airflow version.
    local version key stamp present=1
    version="$("$PYTHON" -c 'from importlib.metadata import version; print(version("apache-airflow-core"))')"
    key="$(printf '%s|%s' "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" "$version" | sha256sum | cut -c1-16)"
    stamp="$AIRFLOW_HOME/.migrated-$key"
    case "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in
        sqlite:///*) [[ -s "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN#sqlite:///}" ]] || present=0 ;;
    esac
    if [[ ! -f "$stamp" || ! -f "$AIRFLOW_HOME/airflow.cfg" || "$present" == 0 ]]; then
        log "airflow db migrate (AIRFLOW_HOME=$AIRFLOW_HOME)"
        if ! (umask 077 && "$AIRFLOW_BIN" db migrate >"$LOG_DIR/db-migrate.log" 2>&1); then
            tail -n 30 "$LOG_DIR/db-migrate.log" >&2
            die "airflow db migrate failed (log: $LOG_DIR/db-migrate.log)"
        fi
        rm -f "$AIRFLOW_HOME"/.migrated-*
        touch "$stamp"
    fi
    # a SQLite metadata DB (and its -wal, -shm files, which SQLite gives the same mode): its owner's only
    case "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in
        sqlite:///*)
            local f
            for f in "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN#sqlite:///}"{,-wal,-shm,-journal}; do
                if [[ -e "$f" ]]; then chmod 600 "$f"; fi
            done ;;
    esac
}

start_component() {
    local name="$1" f
    f="$(pidfile "$name")"
    local -a args=("$name")
    [[ "$name" == "api-server" ]] && args+=(--host "$AIRFLOW__API__HOST" --port "$PORT")
    {
        echo ""
        echo "===== $(date -u +%Y-%m-%dT%H:%M:%SZ) starting airflow ${args[*]} ====="
    } >>"$LOG_DIR/$name.log"
    # The inner shell becomes the session (and process group) leader, writes its own pid, then
    # execs airflow: the pidfile holds the pid of airflow itself, which is also the pgid.
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$f" "$AIRFLOW_BIN" "${args[@]}" \
        >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 50); do
        [[ -s "$f" ]] && break
        sleep 0.1
    done
    [[ -s "$f" ]] || die "could not start $name (no pidfile)"
    log "started $name (pid $(cat "$f"), log $LOG_DIR/$name.log)"
}

tail_logs() {
    local name
    for name in "$@"; do
        echo "----- last lines of $LOG_DIR/$name.log -----" >&2
        tail -n 25 "$LOG_DIR/$name.log" >&2 2>/dev/null || true
    done
}

# wait_healthy SECONDS -> 0 when all components are alive and reported healthy
wait_healthy() {
    local limit="$1" start=$SECONDS last_print=-100 json summary="no answer yet" name dead
    while true; do
        dead=()
        for name in "${COMPONENTS[@]}"; do
            component_pid "$name" >/dev/null || dead+=("$name")
        done
        if ((${#dead[@]})); then
            log "component(s) not running: ${dead[*]}"
            tail_logs "${dead[@]}"
            return 1
        fi
        if json="$(health_json)"; then
            if summary="$(health_summary "$json")"; then
                log "healthy after $((SECONDS - start)) s: $summary"
                return 0
            fi
        else
            summary="API server not answering yet on $HEALTH_URL"
        fi
        if ((SECONDS - start >= limit)); then
            log "not healthy after $limit s: $summary"
            tail_logs "${COMPONENTS[@]}"
            return 1
        fi
        if ((SECONDS - last_print >= 5)); then
            log "waiting ($((SECONDS - start)) s): $summary"
            last_print=$SECONDS
        fi
        sleep 1
    done
}

cmd_up() {
    local wait=1
    [[ "${1:-}" == "--no-wait" ]] && wait=0
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    exec 9>"$RUN_DIR/stack.lock"
    flock -w 60 9 || die "another 'airflow_stack.sh' holds $RUN_DIR/stack.lock"

    local name to_start=()
    for name in "${COMPONENTS[@]}"; do
        if pid="$(component_pid "$name")"; then
            log "$name already running (pid $pid)"
        else
            rm -f "$(pidfile "$name")"
            to_start+=("$name")
        fi
    done
    if ((${#to_start[@]})); then
        ensure_airflow_home
        if [[ " ${to_start[*]} " == *" api-server "* ]] && port_in_use "$PORT"; then
            die "port $PORT on 127.0.0.1 is already in use by another process (set TANDEM_AIRFLOW_PORT)"
        fi
        for name in "${to_start[@]}"; do
            start_component "$name"
        done
    fi
    flock -u 9
    if ((wait)); then
        log "waiting for the stack on http://127.0.0.1:$PORT (up to ${TIMEOUT} s)"
        wait_healthy "$TIMEOUT" || die "the Airflow stack did not become healthy (logs: $LOG_DIR)"
        log "Airflow UI: http://127.0.0.1:$PORT/  ($("$TANDEM_HOME/.venv/bin/tandem" airflow-login))"
    fi
}

cmd_down() {
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/stack.lock"
    flock -w 60 9 || die "another 'airflow_stack.sh' holds $RUN_DIR/stack.lock"
    local name pid pids=() names=()
    for name in "${COMPONENTS[@]}"; do
        if pid="$(component_pid "$name")"; then
            log "stopping $name (process group $pid)"
            kill -TERM -- "-$pid" 2>/dev/null || true
            pids+=("$pid"); names+=("$name")
        else
            rm -f "$(pidfile "$name")"
        fi
    done
    local deadline=$((SECONDS + STOP_TIMEOUT)) i alive
    while true; do
        alive=0
        for pid in "${pids[@]}"; do group_alive "$pid" && alive=1; done
        ((alive)) || break
        if ((SECONDS >= deadline)); then
            for i in "${!pids[@]}"; do
                if group_alive "${pids[$i]}"; then
                    log "${names[$i]} still running after ${STOP_TIMEOUT} s: KILL process group ${pids[$i]}"
                    kill -KILL -- "-${pids[$i]}" 2>/dev/null || true
                fi
            done
            sleep 1
            break
        fi
        sleep 0.5
    done
    for name in "${names[@]}"; do rm -f "$(pidfile "$name")"; done
    log "stack stopped (AIRFLOW_HOME=$AIRFLOW_HOME)"
}

cmd_status() {
    if [[ "${1:-}" == "--wait" ]]; then
        wait_healthy "$TIMEOUT" || true
    fi
    local name pid rc=0 json summary
    echo "AIRFLOW_HOME=$AIRFLOW_HOME  API=http://127.0.0.1:$PORT/"
    for name in "${COMPONENTS[@]}"; do
        if pid="$(component_pid "$name")"; then
            printf '  %-14s running  pid %s\n' "$name" "$pid"
        else
            printf '  %-14s stopped\n' "$name"
            rc=1
        fi
    done
    if json="$(health_json)"; then
        summary="$(health_summary "$json")" || rc=1
        echo "  health: $summary"
    else
        echo "  health: API server not answering on $HEALTH_URL"
        rc=1
    fi
    return "$rc"
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    status) shift; cmd_status "$@" ;;
    restart) cmd_down; cmd_up ;;
    *) echo "usage: $0 up [--no-wait] | down | status [--wait] | restart" >&2; exit 2 ;;
esac

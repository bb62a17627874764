#!/usr/bin/env bash
# Tandem set-up: everything `make setup` does. Idempotent; a second run takes a few seconds.
#
#   1. Java 17 check (Spark needs it)                         -> JAVA_HOME
#   2. .venv with Python 3.11, requirements + an editable install of tandem, with uv when it can be had (on
#      PATH, else installed into .venv with pip, pinned in constraints.txt), else with pip
#      (skipped when .tandem/.installed-<sha of requirements.txt+constraints.txt+pyproject.toml>
#      exists and the venv is intact). PyPI has pyspark and pyspark-client as source only: their wheels are
#      built once per machine into ~/.cache/tandem-wheels (TANDEM_WHEEL_CACHE) and reused by every set-up.
#      Then a .pyc beside each .py of pyspark's python/lib/*.zip, which Spark's Python processes import from
#      (tandem.packaging; skipped when there).
#   3. PostgreSQL for Tandem (scripts/provision_postgres.sh)  -> TANDEM_DATABASE_URL
#   4. Airflow home in .tandem/airflow, SimpleAuthManager password file (admin, random password, 0600)
#   5. .tandem/env.sh (sourced by every make target and by the tests)
#   6. `airflow db migrate` (skipped when already done for this metadata DB + Airflow version)
#   7. a class-data sharing archive for the Spark JVMs, .tandem/spark-cds.jsa (skipped when one exists for
#      this Java and pyspark; optional: without it drivers start as before, only slower). Recorded while
#      step 6 runs: the two are independent; with TANDEM_SPARK_CDS=background (make demo), after set-up returns
#   8. dist/tandem.zip, when missing or older than a file of include/tandem
#   Last: which PostgreSQL database Tandem uses and how to pick another, and each step's time (also in
#   .tandem/setup-times.tsv: step, seconds; `tandem demo` prints it with its own).
#
# Environment it honours (all optional):
#   TANDEM_PYTHON          Python 3.11 interpreter used to create .venv (default: python3.11)
#   TANDEM_DATABASE_URL    use this PostgreSQL database instead of provisioning one
#   TANDEM_AIRFLOW_DB_URL  Airflow metadata DB (SQLAlchemy URL); default SQLite in AIRFLOW_HOME
#   TANDEM_AIRFLOW_PORT    Airflow API server port (default 8080)
#   TANDEM_PG_PORT, TANDEM_PG_SKIP_LOCAL, TANDEM_PG_BINDIR   see scripts/provision_postgres.sh
#   TANDEM_FORCE_INSTALL=1 re-run the installs;  TANDEM_FORCE_MIGRATE=1 re-run db migrate
#   TANDEM_INSTALLER=pip   install with pip even when uv can be had
#   TANDEM_SPARK_CDS       wait (default) | background: record the archive of step 7 without waiting for it
#   TANDEM_WHEEL_CACHE     where the wheels built from source-only releases are kept (~/.cache/tandem-wheels)
#   UV_* (UV_DEFAULT_INDEX, UV_INDEX, UV_FIND_LINKS, ...) are uv's own; uv does not read pip's configuration, so a
#   PIP_INDEX_URL is handed to it as UV_DEFAULT_INDEX when that is not set
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$ROOT/.tandem"
VENV="$ROOT/.venv"
ENV_FILE="$STATE/env.sh"
mkdir -p "$STATE"
# one set-up at a time (parallel `make test` / `make up` in the same checkout)
exec 8>"$STATE/setup.lock"
flock -w 900 8 || { echo "[setup] ERROR: another set-up holds .tandem/setup.lock" >&2; exit 1; }

log() { printf '[setup] %s\n' "$*" >&2; }
# each step's wall-clock time, printed at the end and kept in .tandem/setup-times.tsv (step<TAB>seconds)
TIMES_FILE="$STATE/setup-times.tsv"
STEP_NAMES=()
STEP_SECONDS=()
STEP_STARTED=$(date +%s%N)
step_done() {  # step_done NAME: the time since the previous step_done (or the start) is NAME's
    local now
    now=$(date +%s%N)
    STEP_NAMES+=("$1")
    STEP_SECONDS+=("$(( (now - STEP_STARTED) / 1000000 ))")
    STEP_STARTED=$now
}
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
# shell-quote a value in single quotes (POSIX sh compatible)
sq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

# --- 1. Java 17 -------------------------------------------------------------------------------
java_major() {  # java_major /path/to/java -> prints the major version (8, 11, 17, 21, ...)
    local v
    v="$("$1" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)" || return 1
    [[ -n "$v" ]] || return 1
    case "$v" in
        1.*) v="${v#1.}"; echo "${v%%.*}" ;;
        *) v="${v%%[.+-]*}"; echo "$v" ;;
    esac
}

find_java17() {  # prints JAVA_HOME of a Java 17, or fails
    local cand java
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        if [[ "$(java_major "$JAVA_HOME/bin/java" || true)" == "17" ]]; then
            echo "$JAVA_HOME"; return 0
        fi
        log "JAVA_HOME=$JAVA_HOME is not a Java 17; looking elsewhere"
    fi
    if java="$(command -v java 2>/dev/null)"; then
        if [[ "$(java_major "$java" || true)" == "17" ]]; then
            java="$(readlink -f "$java")"
            dirname "$(dirname "$java")"; return 0
        fi
    fi
    for cand in /usr/lib/jvm/*17*/bin/java /usr/lib/jvm/*/bin/java; do
        [[ -x "$cand" ]] || continue
        if [[ "$(java_major "$cand" || true)" == "17" ]]; then
            dirname "$(dirname "$(readlink -f "$cand")")"; return 0
        fi
    done
    return 1
}

if ! JAVA17_HOME="$(find_java17)"; then
    found="none"
    command -v java >/dev/null 2>&1 && found="$(java -version 2>&1 | head -n1)"
    cat >&2 <<EOF
[setup] ERROR: Java 17 is required (PySpark 4.2 runs on it); found: $found
  Install it and re-run 'make setup':
    Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless
  or point JAVA_HOME at a Java 17 installation:  export JAVA_HOME=/path/to/jdk-17
EOF
    exit 1
fi
log "Java 17: $JAVA17_HOME"
step_done "Java 17 check"

# --- 2. virtualenv -------------------------------------------------------------------------------
find_python311() {
    local p
    for p in "${TANDEM_PYTHON:-}" python3.11 python3 python; do
        [[ -n "$p" ]] || continue
        command -v "$p" >/dev/null 2>&1 || continue
        if "$p" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            echo "$p"; return 0
        fi
    done
    return 1
}

venv_ok() {  # the venv exists, is Python 3.11 and belongs to this directory
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$VENV" <<'PY' 2>/dev/null
import os, sys
ok = sys.version_info[:2] == (3, 11) and os.path.realpath(sys.prefix) == os.path.realpath(sys.argv[1])
sys.exit(0 if ok else 1)
PY
}

if ! venv_ok; then
    PY311="$(find_python311)" || die "Python 3.11 not found (tried \$TANDEM_PYTHON, python3.11, python3). Install Python 3.11 (e.g. apt-get install -y python3.11-venv, or pyenv install 3.11) or set TANDEM_PYTHON=/path/to/python3.11"
    if [[ -e "$VENV" ]]; then
        log "existing .venv is broken, not Python 3.11 or from another path: recreating it"
        rm -rf "$VENV"
    fi
    log "creating .venv with $PY311 ($("$PY311" -V 2>&1))"
    "$PY311" -m venv "$VENV" || die "could not create .venv (Debian: apt-get install -y python3.11-venv)"
    rm -f "$STATE"/.installed-*
fi

step_done "virtualenv"

# The installer: uv (resolves and installs the ~180 pinned packages in seconds; pip takes minutes) when it is on
# PATH or can be installed into .venv, pinned in constraints.txt; else pip. TANDEM_INSTALLER=pip forces pip.
UV=""
if [[ "${TANDEM_INSTALLER:-}" != "pip" ]]; then
    UV_PIN="$(grep -E '^uv==' constraints.txt || true)"
    if command -v uv >/dev/null 2>&1; then
        UV="$(command -v uv)"
    elif [[ -x "$VENV/bin/uv" ]] \
            && [[ -z "$UV_PIN" || "$("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" == "${UV_PIN#uv==}" ]]; then
        UV="$VENV/bin/uv"
    elif "$VENV/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check "${UV_PIN:-uv}"; then
        UV="$VENV/bin/uv"
    else
        log "WARNING: could not install uv into .venv: installing with pip (slower)"
    fi
fi
# uv reads no pip configuration: an index named to pip in the environment is named to uv too
if [[ -n "$UV" && -n "${PIP_INDEX_URL:-}" && -z "${UV_DEFAULT_INDEX:-}${UV_INDEX_URL:-}" ]]; then
    export UV_DEFAULT_INDEX="$PIP_INDEX_URL"
fi
install() {  # install ARGS...: pip-style install arguments, given to uv or to pip
    if [[ -n "$UV" ]]; then
        "$UV" pip install --quiet --python "$VENV/bin/python" "$@"
    else
        "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check "$@"
    fi
}

# pip and setuptools before anything else: ensurepip's (pip 23.2.1, setuptools 65.5.0) have known
# CVEs. Pinned in constraints.txt; upgraded whenever the venv holds other versions.
mapfile -t BOOTSTRAP_PINS < <(grep -E '^(pip|setuptools)==' constraints.txt)
[[ ${#BOOTSTRAP_PINS[@]} -eq 2 ]] || die "constraints.txt must pin pip and setuptools (pip==X, setuptools==Y)"
if ! "$VENV/bin/python" - "${BOOTSTRAP_PINS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None

sys.exit(0 if all(installed(n) == v for n, v in (pin.split("==") for pin in sys.argv[1:])) else 1)
PY
then
    log "upgrading ${BOOTSTRAP_PINS[*]} in .venv"
    install --upgrade "${BOOTSTRAP_PINS[@]}"
fi

# Pinned releases PyPI publishes as source only (no wheel): building pyspark's wheel means downloading its 450 MB
# source and packing it again, minutes each time. Built once per machine into WHEEL_CACHE (outside the checkout, so
# every clone and every new .venv reuses them) and installed from there.
SOURCE_ONLY=(pyspark pyspark-client)
WHEEL_CACHE="${TANDEM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem-wheels}"
wheels_to_build() {  # the name==version pins of SOURCE_ONLY whose wheel the cache lacks
    local name pin
    for name in "${SOURCE_ONLY[@]}"; do
        pin="$(grep -iE "^${name}==" constraints.txt | cut -d' ' -f1 || true)"
        [[ -n "$pin" ]] || { log "WARNING: constraints.txt does not pin $name: not cached"; continue; }
        compgen -G "$WHEEL_CACHE/${name//-/_}-${pin#*==}-*.whl" >/dev/null || echo "$pin"
    done
}

DEPS_SHA="$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)"
STAMP="$STATE/.installed-$DEPS_SHA"
if [[ -f "$STAMP" && -x "$VENV/bin/tandem" && "${TANDEM_FORCE_INSTALL:-0}" != "1" ]]; then
    log "Python dependencies up to date (.tandem/.installed-$DEPS_SHA)"
else
    t0=$SECONDS
    mapfile -t TO_BUILD < <(wheels_to_build)
    if [[ ${#TO_BUILD[@]} -gt 0 ]]; then
        log "building wheels of ${TO_BUILD[*]} (source-only on PyPI) into $WHEEL_CACHE, once for this machine"
        mkdir -p "$WHEEL_CACHE"
        build_dir="$(mktemp -d "$WHEEL_CACHE/.build.XXXXXX")"
        if "$VENV/bin/python" -m pip wheel --quiet --progress-bar off --disable-pip-version-check --no-deps \
                -w "$build_dir" "${TO_BUILD[@]}"; then
            mv -f "$build_dir"/*.whl "$WHEEL_CACHE"/
        else
            log "WARNING: could not build the wheels into $WHEEL_CACHE: the installer builds them itself"
        fi
        rm -rf "$build_dir"
    fi
    log "installing Python dependencies into .venv (${UV:+uv }pip install -r requirements.txt -c constraints.txt)"
    install --find-links "$WHEEL_CACHE" -r requirements.txt -c constraints.txt
    log "installing tandem (editable, no dependencies)"
    install --no-deps -e .
    rm -f "$STATE"/.installed-*
    touch "$STAMP"
    log "Python dependencies installed in $((SECONDS - t0)) s${UV:+ (uv)}"
fi
step_done "Python dependencies"

# spark-submit puts pyspark's python/lib/*.zip ahead of site-packages on the driver's and every Python worker's
# path, and Python caches no bytecode for a zip: each process compiled what it imported from it (0.6 CPU s a
# worker). Each .py there gets its .pyc (checked against its source's hash), after every install that replaced them.
"$VENV/bin/python" -m tandem.packaging --spark-zips 2>&1 | sed 's/^/[setup] /' >&2 \
    || log "WARNING: could not add bytecode to pyspark's zips (Spark's Python processes compile their imports: slower)"
step_done "bytecode in pyspark's zips"

# --- 3. PostgreSQL -------------------------------------------------------------------------------
# When TANDEM_DATABASE_URL merely echoes what a previous set-up provisioned (a shell that sourced
# .tandem/env.sh), provision again instead: that restarts a stopped private cluster.
PROVISIONED_FILE="$STATE/provisioned_database_url"
# A database chosen with TANDEM_DATABASE_URL is remembered (0600) for the set-ups after it (`make demo`, `make up`
# run one), so that it is not swapped for the shared one when the variable is not set again; removing the file
# lets set-up provision a database again.
CHOSEN_FILE="$STATE/database_url"
if [[ -n "${TANDEM_DATABASE_URL:-}" && -f "$PROVISIONED_FILE" \
        && "$TANDEM_DATABASE_URL" == "$(cat "$PROVISIONED_FILE")" ]]; then
    unset TANDEM_DATABASE_URL
fi
DB_CHOICE="provisioned"
if [[ -n "${TANDEM_DATABASE_URL:-}" ]]; then
    DB_CHOICE="environment"
elif [[ -s "$CHOSEN_FILE" ]]; then
    TANDEM_DATABASE_URL="$(cat "$CHOSEN_FILE")"
    export TANDEM_DATABASE_URL
    DB_CHOICE="remembered"
fi
if [[ -n "${TANDEM_DATABASE_URL:-}" ]]; then
    DB_URL="$(bash "$ROOT/scripts/provision_postgres.sh" ensure)"
    rm -f "$PROVISIONED_FILE"
    (umask 077 && printf '%s\n' "$DB_URL" >"$CHOSEN_FILE" && chmod 600 "$CHOSEN_FILE")
else
    DB_URL="$(bash "$ROOT/scripts/provision_postgres.sh" ensure)"
    (umask 077 && printf '%s\n' "$DB_URL" >"$PROVISIONED_FILE" && chmod 600 "$PROVISIONED_FILE")
fi
[[ -n "$DB_URL" ]] || die "PostgreSQL provisioning returned no URL"
DB_SHOWN="$(TANDEM_URL="$DB_URL" "$VENV/bin/python" -c \
    'import os; from tandem.store.db import redact; print(redact(os.environ["TANDEM_URL"]))')"
case "$DB_CHOICE" in
    environment) DB_WHY=("named by TANDEM_DATABASE_URL (remembered in .tandem/database_url for the next set-ups)") ;;
    remembered) DB_WHY=("named by TANDEM_DATABASE_URL at an earlier set-up (remembered in .tandem/database_url)") ;;
    *) if [[ "$DB_URL" == "postgresql://postgres@127.0.0.1:5432/tandem" ]]; then
           DB_WHY=("database tandem of the PostgreSQL server on 127.0.0.1:5432, SHARED with every checkout on this"
                   "machine that sets no TANDEM_DATABASE_URL: their plans of the same name are the same plans")
       else
           DB_WHY=("this checkout's private PostgreSQL cluster (.tandem/pg; scripts/provision_postgres.sh status)")
       fi ;;
esac
log "Tandem database: $DB_SHOWN"
step_done "PostgreSQL"

# --- 4. Airflow home -----------------------------------------------------------------------------
AIRFLOW_PORT_DEFAULT="${TANDEM_AIRFLOW_PORT:-8080}"
[[ "$AIRFLOW_PORT_DEFAULT" =~ ^[0-9]+$ ]] || die "TANDEM_AIRFLOW_PORT must be a number"
# Tandem's own folders of Airflow state and data (the default storage root, the NATS store): readable by
# their owner only. A storage root elsewhere (TANDEM_STORAGE_ROOT) keeps its mode; the folders Tandem
# creates in it are made 0700 (tandem.layout.make_private_dirs).
mkdir -p "$STATE/airflow" "$STATE/data"
chmod 700 "$STATE/airflow" "$STATE/data"
# Airflow 3 also opens an async engine on the metadata DB: PostgreSQL needs asyncpg there.
case "${TANDEM_AIRFLOW_DB_URL:-}" in
    postgresql*|postgres:*)
        "$VENV/bin/python" -c 'import asyncpg' 2>/dev/null || die "TANDEM_AIRFLOW_DB_URL is PostgreSQL, which Airflow 3 also reaches through asyncpg, and asyncpg is not installed in .venv. Add asyncpg (e.g. asyncpg==0.31.0) to requirements.txt/constraints.txt, or: .venv/bin/pip install asyncpg" ;;
esac

# --- 5. env.sh -----------------------------------------------------------------------------------
# Written for POSIX sh (tests may source it from /bin/sh). Values chosen at set-up time are baked
# in as defaults; TANDEM_* variables present when the file is sourced take precedence.
TMP_ENV="$(mktemp "$STATE/env.sh.XXXXXX")"
trap 'rm -f "$TMP_ENV"' EXIT
cat >"$TMP_ENV" <<EOF
# Generated by scripts/setup.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ). Do not edit: re-run 'make setup'.
# Source it:  . .tandem/env.sh
# Overrides honoured when set before sourcing: TANDEM_DATABASE_URL, TANDEM_AIRFLOW_HOME,
# TANDEM_AIRFLOW_PORT, TANDEM_AIRFLOW_DB_URL, TANDEM_DAGS_FOLDER.
export TANDEM_HOME=$(sq "$ROOT")
if [ -z "\${TANDEM_DATABASE_URL:-}" ]; then TANDEM_DATABASE_URL=$(sq "$DB_URL"); fi
export TANDEM_DATABASE_URL
export JAVA_HOME=$(sq "$JAVA17_HOME")

# Python / Spark
case ":\$PATH:" in
  ":\$TANDEM_HOME/.venv/bin:"*) ;;
  *) PATH="\$TANDEM_HOME/.venv/bin:\$PATH" ;;
esac
export PATH
export PYSPARK_PYTHON="\$TANDEM_HOME/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="\$TANDEM_HOME/.venv/bin/python"
# Let Python keep its bytecode caches (__pycache__): where the host sets PYTHONDONTWRITEBYTECODE (container
# images often do), every process compiled every module it imports from source again, Airflow's, pyspark's and
# great_expectations' thousands among them: ~40 % of a dag.test() run, and of every Airflow component, task,
# driver and CLI call. The caches are written once, by the first process that imports a module.
unset PYTHONDONTWRITEBYTECODE

# Airflow
export AIRFLOW_HOME="\${TANDEM_AIRFLOW_HOME:-\$TANDEM_HOME/.tandem/airflow}"
export TANDEM_AIRFLOW_PORT="\${TANDEM_AIRFLOW_PORT:-$AIRFLOW_PORT_DEFAULT}"
# TANDEM_AIRFLOW_HOST: the address the API server listens on (0.0.0.0 when workers on other hosts
# reach it); TANDEM_AIRFLOW_URL: how every host reaches it.
export TANDEM_AIRFLOW_HOST="\${TANDEM_AIRFLOW_HOST:-127.0.0.1}"
export TANDEM_AIRFLOW_URL="\${TANDEM_AIRFLOW_URL:-http://127.0.0.1:\$TANDEM_AIRFLOW_PORT}"
if [ -z "\${TANDEM_AIRFLOW_DB_URL:-}" ]; then TANDEM_AIRFLOW_DB_URL=$(sq "${TANDEM_AIRFLOW_DB_URL:-}"); fi
if [ -n "\$TANDEM_AIRFLOW_DB_URL" ]; then
  export TANDEM_AIRFLOW_DB_URL
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="\$TANDEM_AIRFLOW_DB_URL"
else
  unset TANDEM_AIRFLOW_DB_URL
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///\$AIRFLOW_HOME/airflow.db"
fi
export AIRFLOW__CORE__DAGS_FOLDER="\${TANDEM_DAGS_FOLDER:-\$TANDEM_HOME/dags}"
export AIRFLOW__CORE__PLUGINS_FOLDER="\$TANDEM_HOME/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
# LocalExecutor on one host; with nodes on their own hosts (airflow_queue in cluster.yaml) set
# TANDEM_AIRFLOW_EXECUTOR=LocalExecutor,airflow.providers.edge3.executors.EdgeExecutor and run an
# Edge worker per node's host (README, "Deploying on several hosts").
export AIRFLOW__CORE__EXECUTOR="\${TANDEM_AIRFLOW_EXECUTOR:-LocalExecutor}"
case "\$AIRFLOW__CORE__EXECUTOR" in
  *EdgeExecutor*)
    export AIRFLOW__EDGE__API_ENABLED=True
    export AIRFLOW__EDGE__API_URL="\$TANDEM_AIRFLOW_URL/edge_worker/v1/rpcapi"
    export AIRFLOW__EDGE__JOB_POLL_INTERVAL="\${AIRFLOW__EDGE__JOB_POLL_INTERVAL:-1}"
    export AIRFLOW__EDGE__HEARTBEAT_INTERVAL="\${AIRFLOW__EDGE__HEARTBEAT_INTERVAL:-10}"
    # a node host's worker outlives an outage of the control host (the default gives up after ~10
    # random waits, as little as a minute, and the worker exits) and is back within 10 s of its return
    export AIRFLOW__EDGE__API_RETRIES="\${AIRFLOW__EDGE__API_RETRIES:-100000}"
    export AIRFLOW__EDGE__API_RETRY_WAIT_MAX="\${AIRFLOW__EDGE__API_RETRY_WAIT_MAX:-10}"
    # a worker's request token is valid for [api_auth] jwt_leeway seconds, and the API server accepts it that
    # much longer: by default 2 x 10 s, so a request queued behind a stalled API server (23 s seen) was refused
    # with 403, which the worker does not retry: it exited
    export AIRFLOW__API_AUTH__JWT_LEEWAY="\${AIRFLOW__API_AUTH__JWT_LEEWAY:-120}"
    ;;
esac
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
# users:roles of SimpleAuthManager (roles: viewer, user, op, admin); each gets a random password in the file below
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="\${TANDEM_AIRFLOW_USERS:-admin:admin}"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="\$AIRFLOW_HOME/simple_auth_manager_passwords.json"
export AIRFLOW__API__HOST="\$TANDEM_AIRFLOW_HOST"
export AIRFLOW__API__PORT="\$TANDEM_AIRFLOW_PORT"
export AIRFLOW__API__BASE_URL="\$TANDEM_AIRFLOW_URL"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="\$TANDEM_AIRFLOW_URL/execution/"
# log servers of the scheduler (LocalExecutor) and triggerer: 8793/8794 for port 8080, shifted
# with the API port so that a second (test) stack on another port does not collide
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT="\$((TANDEM_AIRFLOW_PORT + 713))"
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT="\$((TANDEM_AIRFLOW_PORT + 714))"
# pick up new DAG files within 30 s (default 300 s)
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30

# Spark JVMs (drivers, in-process sessions) map the classes recorded by step 7 of scripts/setup.sh
# instead of loading them again; a JVM that cannot use the archive warns once and starts as before.
if [ -z "\${SPARK_SUBMIT_OPTS:-}" ] && [ -s $(sq "$STATE/spark-cds.jsa") ]; then
  export SPARK_SUBMIT_OPTS=$(sq "-XX:SharedArchiveFile=$STATE/spark-cds.jsa")
fi
EOF

# Spark node connections (AIRFLOW_CONN_...) from conf/cluster.yaml.
if [[ -x "$VENV/bin/tandem" ]]; then
    if conn_lines="$(env -i HOME="${HOME:-/tmp}" PATH="/usr/bin:/bin" sh -c ". '$TMP_ENV' && tandem airflow-env" 2>"$STATE/airflow-env.err")"; then
        {
            echo ""
            echo "# Spark node connections: output of 'tandem airflow-env'"
            printf '%s\n' "$conn_lines"
        } >>"$TMP_ENV"
        rm -f "$STATE/airflow-env.err"
    else
        log "WARNING: 'tandem airflow-env' failed (see .tandem/airflow-env.err); env.sh has no AIRFLOW_CONN_ lines"
    fi
fi

chmod 600 "$TMP_ENV"
sh -n "$TMP_ENV" || die "generated env file has a syntax error: $TMP_ENV"
mv -f "$TMP_ENV" "$ENV_FILE"
trap - EXIT
log "wrote .tandem/env.sh"

# shellcheck source=/dev/null
. "$ENV_FILE"

# SimpleAuthManager reads {"user": "password"} from this file. The first set-up gives `admin` a
# random password (mode 0600); an operator's change is kept. No default password exists.
mkdir -p "$AIRFLOW_HOME"
"$VENV/bin/tandem" airflow-login --ensure | while IFS= read -r line; do log "$line"; done
step_done "Airflow home, .tandem/env.sh"

# --- 7. class-data sharing archive for the Spark JVMs (in the background, while step 6 runs) ---------
# A Spark driver spends seconds loading and verifying the same ~20,000 classes at every start; a dynamic
# CDS archive recorded once (scripts/spark_cds_training.py) lets each JVM map them instead. The archive
# fits one JVM build and one class path, so it is keyed on both; it is written to a temporary name,
# checked by a second run that uses it, and only then renamed (a truncated archive crashes the JVM).
CDS_ARCHIVE="$STATE/spark-cds.jsa"
# pyspark's version and folder: the jars on the class path (a venv made again at another path moves them)
PYSPARK_JARS="$("$VENV/bin/python" -c 'import os, pyspark; print(pyspark.__version__, os.path.dirname(pyspark.__file__))')"
CDS_KEY="$(printf '%s|%s' "$("$JAVA_HOME/bin/java" -version 2>&1 | head -n 2 | tr '\n' ' ')" "$PYSPARK_JARS" | sha256sum | cut -c1-16)"
CDS_STAMP="$STATE/.spark-cds-$CDS_KEY"
CDS_PID=""
# TANDEM_SPARK_CDS=background (make demo sets it): set-up does not wait for the archive; it is recorded at a low
# priority after set-up returns, for the JVMs of the environments sourced after that (the demo's start at once,
# on a machine as busy as the demo makes it, and would wait longer for the archive than it saves them).
CDS_MODE="${TANDEM_SPARK_CDS:-wait}"
[[ "$CDS_MODE" == wait || "$CDS_MODE" == background ]] || die "TANDEM_SPARK_CDS must be wait or background"
record_cds() {  # the archive, or a warning; runs in a subshell of its own, one at a time (.tandem/spark-cds.lock)
    local tmp="$STATE/spark-cds.jsa.tmp" cds_log="$STATE/spark-cds.log" nice=()
    [[ "$CDS_MODE" == wait ]] || nice=(nice -n 10)
    exec 9>"$STATE/spark-cds.lock"
    flock -w 600 9 || { log "WARNING: another set-up holds .tandem/spark-cds.lock: no archive recorded"; return; }
    if [[ -s "$CDS_ARCHIVE" && -f "$CDS_STAMP" ]]; then return; fi  # recorded meanwhile by that one
    rm -f "$tmp"
    if SPARK_SUBMIT_OPTS="-XX:ArchiveClassesAtExit=$tmp" "${nice[@]}" spark-submit --master 'local[1]' \
            "$ROOT/scripts/spark_cds_training.py" >"$cds_log" 2>&1 \
        && SPARK_SUBMIT_OPTS="-XX:SharedArchiveFile=$tmp" "${nice[@]}" spark-submit --master 'local[1]' \
            "$ROOT/scripts/spark_cds_training.py" >>"$cds_log" 2>&1; then
        mv -f "$tmp" "$CDS_ARCHIVE"
        touch "$CDS_STAMP"
        log "wrote .tandem/spark-cds.jsa"
    else
        rm -f "$tmp"
        log "WARNING: no Spark class-data sharing archive (see .tandem/spark-cds.log); drivers start without it"
    fi
}
if [[ -s "$CDS_ARCHIVE" && -f "$CDS_STAMP" ]]; then
    log "Spark class-data sharing archive up to date"
else
    rm -f "$CDS_ARCHIVE" "$STATE"/.spark-cds-*
    if [[ "$CDS_MODE" == wait ]]; then
        log "recording the Spark class-data sharing archive (one Spark job run twice, ~30 s, beside the next step)"
        record_cds 8>&- &  # not holding set-up's lock (fd 8)
        CDS_PID=$!
    else
        log "recording the Spark class-data sharing archive in the background, at a low priority" \
            "(TANDEM_SPARK_CDS=background; .tandem/spark-cds.log); environments sourced once it is written use it"
        (record_cds >>"$STATE/spark-cds.log" 2>&1 8>&- </dev/null &)
    fi
fi

# --- 6. airflow db migrate -----------------------------------------------------------------------
AIRFLOW_VERSION="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("apache-airflow-core"))')"
MIGRATE_KEY="$(printf '%s|%s' "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" "$AIRFLOW_VERSION" | sha256sum | cut -c1-16)"
MIGRATE_STAMP="$AIRFLOW_HOME/.migrated-$MIGRATE_KEY"
db_present=1
case "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in
    sqlite:///*) [[ -s "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN#sqlite:///}" ]] || db_present=0 ;;
esac
if [[ -f "$MIGRATE_STAMP" && -f "$AIRFLOW_HOME/airflow.cfg" && "$db_present" == 1 && "${TANDEM_FORCE_MIGRATE:-0}" != "1" ]]; then
    log "Airflow metadata DB up to date (airflow $AIRFLOW_VERSION)"
else
    log "airflow db migrate (airflow $AIRFLOW_VERSION, AIRFLOW_HOME=$AIRFLOW_HOME)"
    mkdir -p "$AIRFLOW_HOME/logs"
    if ! (umask 077 && airflow db migrate >"$AIRFLOW_HOME/logs/db-migrate.log" 2>&1); then
        tail -n 30 "$AIRFLOW_HOME/logs/db-migrate.log" >&2
        die "airflow db migrate failed (full log: $AIRFLOW_HOME/logs/db-migrate.log)"
    fi
    rm -f "$AIRFLOW_HOME"/.migrated-*
    touch "$MIGRATE_STAMP"
fi
step_done "Airflow db migrate"
# A SQLite metadata DB holds Airflow's users' runs, connections and variables: its owner's only (SQLite
# gives its -wal and -shm files the database file's mode).
case "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in
    sqlite:///*)
        for f in "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN#sqlite:///}"{,-wal,-shm,-journal}; do
            if [[ -e "$f" ]]; then chmod 600 "$f"; fi
        done ;;
esac

if [[ -n "$CDS_PID" ]]; then
    wait "$CDS_PID" || true
    step_done "Spark class-data archive (the rest of it)"
fi

# --- 8. dist/tandem.zip (`tandem launch` submits it with every node) ---------------------------------
DIST="$ROOT/dist/tandem.zip"
if [[ -s "$DIST" && -z "$(find "$ROOT/include/tandem" -type f -newer "$DIST" \( -name '*.py' -o -name '*.sql' \
        -o -name '*.html' \) -print -quit)" ]]; then
    log "dist/tandem.zip up to date"
else
    "$VENV/bin/python" -m tandem.packaging "$ROOT" | while IFS= read -r line; do log "$line"; done
fi
step_done "dist/tandem.zip"

# --- the database, and each step's time ------------------------------------------------------------
: >"$TIMES_FILE.tmp"
total_ms=0
for i in "${!STEP_NAMES[@]}"; do
    printf '%s\t%d.%03d\n' "${STEP_NAMES[$i]}" $((STEP_SECONDS[i] / 1000)) $((STEP_SECONDS[i] % 1000)) \
        >>"$TIMES_FILE.tmp"
    total_ms=$((total_ms + STEP_SECONDS[i]))
done
mv -f "$TIMES_FILE.tmp" "$TIMES_FILE"
log "step times: $(awk -F'\t' '{ printf "%s%s %.0f s", (NR > 1 ? ", " : ""), $1, $2 }' "$TIMES_FILE");" \
    "total $((total_ms / 1000)) s"
log "Tandem database: $DB_SHOWN"
for line in "${DB_WHY[@]}"; do log "  $line"; done
log "  another one: TANDEM_DATABASE_URL=postgresql://USER@HOST:PORT/DBNAME make setup (password in ~/.pgpass) (remembered in"
log "  .tandem/database_url; remove that file to provision again), or TANDEM_PG_SKIP_LOCAL=1 make setup for a private"
log "  cluster of this checkout under .tandem/pg (port TANDEM_PG_PORT, default 55432)"
log "done. Load the environment with:  . .tandem/env.sh"

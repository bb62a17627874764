#!/usr/bin/env bash
# Provision the PostgreSQL database Tandem keeps its coordination state in.
#
# Usage: scripts/provision_postgres.sh [ensure|status|stop|destroy]
#
#   ensure   (default) make sure a reachable database exists and print its URL on stdout
#            (the only thing written to stdout; progress goes to stderr). Order:
#              1. TANDEM_DATABASE_URL is set       -> use it; fail clearly if it does not connect.
#              2. a private cluster already exists under .tandem/pg/ -> (re)start it and use it
#                 (sticky: once created, the private cluster keeps being used).
#              3. 127.0.0.1:5432 answers pg_isready -> postgresql://postgres@127.0.0.1:5432/tandem,
#                 database `tandem` created if missing.
#              4. otherwise initdb + start a private cluster under .tandem/pg/ with this machine's
#                 PostgreSQL binaries, listening on 127.0.0.1:$TANDEM_PG_PORT. Run as root, the
#                 cluster is owned and run by the unprivileged system user `tandem` (created with
#                 useradd --system).
#            The private cluster asks every client for a password (scram-sha-256, no trust line
#            in pg_hba.conf). Its superuser `postgres` is for this script only; Tandem connects as
#            the role `tandem`: LOGIN, not a superuser, no CREATEROLE/REPLICATION/BYPASSRLS, owner
#            of the database `tandem` (CREATEDB: the tests make throw-away databases beside it).
#            Both random passwords live in <cluster dir>/pgpass, mode 0600, in libpq's password
#            file format (the script's own connections find them through PGPASSFILE); the URL
#            printed, postgresql://tandem:<password>@127.0.0.1:<port>/tandem, goes to set-up's
#            0600 files (.tandem/provisioned_database_url, .tandem/env.sh). A password is never
#            on a command line. A cluster made by an earlier version (trust auth, Tandem as
#            `postgres`) is secured the same way by the next `ensure`: passwords, the role, its
#            ownership of the database and of what Tandem created in it, then no trust.
#   status   print where the private cluster is and whether it runs
#   stop     stop the private cluster (if any)
#   destroy  stop it and delete its data directory
#
# Environment:
#   TANDEM_DATABASE_URL   use this database instead of provisioning one
#   TANDEM_PG_PORT        port of the private cluster (default: the port it last ran on, else 55432)
#   TANDEM_PG_DIR         where the private cluster lives (default <project>/.tandem/pg)
#   TANDEM_PG_BINDIR      directory holding initdb/pg_ctl/postgres (default: pg_config --bindir,
#                         else the newest /usr/lib/postgresql/*/bin, else initdb on PATH)
#   TANDEM_PG_SKIP_LOCAL  =1 ignores a server on 127.0.0.1:5432 (forces the private cluster)
#   TANDEM_PG_LISTEN      address the private cluster listens on (default 127.0.0.1); any other
#                         address also admits clients on its own subnets, with a password (the
#                         multi-host tests' bridge; never a real network)
#   TANDEM_PG_USER        OS user that owns the private cluster when run as root (default tandem)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_PORT="${TANDEM_PG_PORT:-55432}"
PG_DIR="${TANDEM_PG_DIR:-$ROOT/.tandem/pg}"
PG_OS_USER="${TANDEM_PG_USER:-tandem}"
PG_LISTEN="${TANDEM_PG_LISTEN:-127.0.0.1}"
DB_NAME=tandem
APP_ROLE=tandem   # the role Tandem connects as (not a superuser)
umask 077         # logs, the port file and pgpass: readable by their owner only

log() { printf '[provision_postgres] %s\n' "$*" >&2; }
die() { printf '[provision_postgres] ERROR: %s\n' "$*" >&2; exit 1; }

# --- helpers ------------------------------------------------------------------------------------

find_bindir() {
    local d
    if [[ -n "${TANDEM_PG_BINDIR:-}" ]]; then
        [[ -x "$TANDEM_PG_BINDIR/initdb" ]] || die "TANDEM_PG_BINDIR=$TANDEM_PG_BINDIR has no initdb"
        echo "$TANDEM_PG_BINDIR"; return 0
    fi
    if command -v pg_config >/dev/null 2>&1; then
        d="$(pg_config --bindir 2>/dev/null || true)"
        if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then echo "$d"; return 0; fi
    fi
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then echo "$d"; return 0; fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"; return 0
    fi
    return 1
}

BINDIR="$(find_bindir || true)"

# A client tool (psql, pg_isready): prefer the one on PATH, then the server's bindir.
client() {
    local tool="$1"
    if command -v "$tool" >/dev/null 2>&1; then command -v "$tool"; return 0; fi
    if [[ -n "$BINDIR" && -x "$BINDIR/$tool" ]]; then echo "$BINDIR/$tool"; return 0; fi
    return 1
}

# Connecting goes through Tandem's own store code (tandem.store.db): URLs reach Python in the
# environment (TANDEM_PROVISION_URL), never on a command line that `ps` shows, and every message
# about a URL comes from tandem.store.db.redact (no password in any output).
STORE_PY=""  # a Python with what tandem.store.db needs; found once by find_store_python (subshells inherit it)
find_store_python() {
    local py
    for py in "$ROOT/.venv/bin/python" python3; do
        if "$py" -c 'import psycopg2, tenacity' >/dev/null 2>&1; then STORE_PY="$py"; return; fi
    done
    die "no Python with psycopg2 and tenacity to reach PostgreSQL: run 'make setup' first"
}

py_store() {  # py_store URL PYTHON_CODE [ARGS...] -> runs PYTHON_CODE with the URL in the environment
    local url="$1" code="$2"
    shift 2
    [[ -n "$STORE_PY" ]] || find_store_python
    TANDEM_PROVISION_URL="$url" PYTHONPATH="$ROOT/include${PYTHONPATH:+:$PYTHONPATH}" "$STORE_PY" -c "$code" "$@"
}

# redacted URL -> the URL without its password, for messages
redacted() {
    py_store "$1" 'import os; from tandem.store.db import redact; print(redact(os.environ["TANDEM_PROVISION_URL"]))'
}

# try_connect URL -> 0 when a connection opens; else 1, with the reason (password-free) on stderr.
try_connect() {
    py_store "$1" '
import os, sys
from tandem.errors import StoreError
from tandem.store.db import connect
try:
    connect(os.environ["TANDEM_PROVISION_URL"], "tandem-provision").close()
except StoreError as exc:
    sys.exit(f"[provision_postgres] {exc}")
'
}

# run_sql URL SQL -> runs one statement, prints the result (tuples only).
run_sql() {
    py_store "$1" '
import os, sys
from tandem.store.db import connect
conn = connect(os.environ["TANDEM_PROVISION_URL"], "tandem-provision")
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute(sys.argv[1])
    if cur.description:
        for row in cur.fetchall():
            print("|".join("" if v is None else str(v) for v in row))
conn.close()
' "$2"
}

# ensure_db ADMIN_URL_BASE -> creates database `tandem` when missing (owned by the connecting role).
# ADMIN_URL_BASE is the URL without a database name, e.g. postgresql://postgres@127.0.0.1:5432
ensure_db() {
    local base="$1" exists
    exists="$(run_sql "$base/postgres" "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" \
        || die "cannot query $base/postgres"
    if [[ "$exists" != "1" ]]; then
        log "creating database $DB_NAME on ${base#*@}"
        # A concurrent set-up may create it at the same moment: re-check instead of failing.
        if ! run_sql "$base/postgres" "CREATE DATABASE $DB_NAME" >/dev/null 2>&1; then
            exists="$(run_sql "$base/postgres" "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")"
            [[ "$exists" == "1" ]] || die "could not create database $DB_NAME on ${base#*@}"
        fi
    fi
}

is_root() { [[ "$(id -u)" == "0" ]]; }

# as_owner CMD... -> runs CMD as the cluster owner (the `tandem` system user when we are root).
as_owner() {
    if is_root; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u "$PG_OS_USER" -- "$@"
        else
            su -s /bin/sh "$PG_OS_USER" -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

ensure_os_user() {
    is_root || return 0
    if ! getent passwd "$PG_OS_USER" >/dev/null 2>&1; then
        command -v useradd >/dev/null 2>&1 || die "useradd not found: cannot create system user $PG_OS_USER"
        log "creating unprivileged system user $PG_OS_USER to own the private PostgreSQL cluster"
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            --user-group "$PG_OS_USER" 2>/dev/null \
            || getent passwd "$PG_OS_USER" >/dev/null \
            || die "useradd $PG_OS_USER failed"
    fi
}

# own_link_target -> the directory the symbolic link $PG_DIR names, when it is one this script made: a
# real directory /var/lib/tandem/pg-<12 hex>-<6 characters> (an earlier version's: without the last part;
# only root writes /var/lib/tandem). A link
# anyone else made is never followed: its target is not chowned, initialised, started, stopped or removed.
own_link_target() {
    local target
    target="$(readlink "$PG_DIR")"
    if [[ "$target" =~ ^/var/lib/tandem/pg-[0-9a-f]{12}(-[A-Za-z0-9]{6})?$ && -d "$target" && ! -L "$target" \
            && ! -L /var/lib/tandem ]]; then
        echo "$target"; return 0
    fi
    log "ERROR: $PG_DIR is a symbolic link to $target, which this script did not make (its clusters live in" \
        "/var/lib/tandem/pg-<hash>-<random>): not following it. Remove the link, or set TANDEM_PG_DIR to the" \
        "cluster's real directory"
    return 1
}

# The directory really used for the cluster. As root, the `tandem` user must be able to reach it;
# a project under a private home (/root is 0700) cannot be, so the cluster then lives under
# a new /var/lib/tandem/pg-<hash>-<random> and .tandem/pg is a symlink to it.
resolve_pg_dir() {
    if [[ -L "$PG_DIR" ]]; then own_link_target || exit 1; return; fi
    if [[ -d "$PG_DIR" ]] || ! is_root; then echo "$PG_DIR"; return; fi
    mkdir -p "$PG_DIR"
    chown "$PG_OS_USER:" "$PG_DIR"
    if runuser -u "$PG_OS_USER" -- test -w "$PG_DIR" 2>/dev/null; then
        echo "$PG_DIR"; return
    fi
    rmdir "$PG_DIR"
    local h alt
    h="$(printf '%s' "$PG_DIR" | sha256sum | cut -c1-12)"  # which cluster directory it serves, for a reader
    # A new directory every time (the link remembers it): a cluster left behind by a killed run of the same
    # path (a test's temporary directory is reused after a reboot) must never be started as this new one.
    mkdir -p /var/lib/tandem
    chmod 755 /var/lib/tandem
    alt="$(mktemp -d "/var/lib/tandem/pg-$h-XXXXXX")"
    log "$PG_OS_USER cannot reach $PG_DIR (a parent directory is private); using $alt"
    chown "$PG_OS_USER:" "$alt"
    ln -s "$alt" "$PG_DIR"
    echo "$alt"
}

no_binaries_message() {
    cat >&2 <<EOF
[provision_postgres] ERROR: no PostgreSQL server is reachable and no PostgreSQL binaries were found.
  Tandem needs a PostgreSQL database. Pick one:
    * install PostgreSQL (Debian/Ubuntu: sudo apt-get install -y postgresql) and re-run 'make setup'
      (a server on 127.0.0.1:5432 is used directly; with only the binaries, Tandem starts its own
      private cluster under .tandem/pg on port ${PG_PORT});
    * or point Tandem at an existing database:
        export TANDEM_DATABASE_URL=postgresql://user:password@host:5432/dbname
      and re-run 'make setup'.
EOF
    exit 1
}

# --- passwords of the private cluster ---------------------------------------------------------------
# <cluster dir>/pgpass, libpq's password file format (host:port:database:user:password), mode 0600:
# one line for the superuser `postgres`, one for the application role. The passwords are URL- and
# pgpass-safe (letters, digits, - and _), from Python's secrets module.

new_password() { "${STORE_PY:-python3}" -c 'import secrets; print(secrets.token_urlsafe(24))'; }

ensure_pgpass() {  # ensure_pgpass DIR -> DIR/pgpass with both passwords (kept when present)
    local file="$1/pgpass"
    if [[ ! -s "$file" ]]; then
        log "giving the private cluster's roles random passwords ($file, mode 0600)"
        printf '*:*:*:postgres:%s\n*:*:*:%s:%s\n' "$(new_password)" "$APP_ROLE" "$(new_password)" >"$file.tmp"
        chmod 600 "$file.tmp"
        mv -f "$file.tmp" "$file"
    fi
    chmod 600 "$file"
}

password_of() {  # password_of DIR ROLE -> the role's password from DIR/pgpass
    awk -F: -v role="$2" '$4 == role { print $5; exit }' "$1/pgpass"
}

hba_trusts() { grep -Eq '^[[:space:]]*[^#[:space:]].*[[:space:]]trust[[:space:]]*$' "$1/pg_hba.conf"; }

# secure_private DIR DATA PORT: the application role, its database and what it owns, and password
# authentication for every client (a cluster an earlier version made with trust is converted).
secure_private() {
    local dir="$1" data="$2" port="$3" admin
    admin="postgresql://postgres@$PG_LISTEN:$port"
    export PGPASSFILE="$dir/pgpass"
    if hba_trusts "$data"; then  # made by an earlier version: postgres gets its password first
        TANDEM_PROVISION_PASSWORD="$(password_of "$dir" postgres)" py_store "$admin/postgres" '
import os
from psycopg2 import sql
from tandem.store.db import connect
conn = connect(os.environ["TANDEM_PROVISION_URL"], "tandem-provision")
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(os.environ["TANDEM_PROVISION_PASSWORD"])))
conn.close()
' || die "could not set the password of postgres"
    fi
    ensure_db "$admin"
    TANDEM_PROVISION_PASSWORD="$(password_of "$dir" "$APP_ROLE")" py_store "$admin/$DB_NAME" '
import os, sys
from psycopg2 import sql
from tandem.store.db import connect
role, database = sys.argv[1], sys.argv[2]
conn = connect(os.environ["TANDEM_PROVISION_URL"], "tandem-provision")
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
    verb = "ALTER" if cur.fetchone() else "CREATE"
    cur.execute(sql.SQL(verb + " ROLE {} WITH LOGIN NOSUPERUSER NOCREATEROLE CREATEDB NOREPLICATION NOBYPASSRLS "
                        "PASSWORD {}").format(sql.Identifier(role), sql.Literal(os.environ["TANDEM_PROVISION_PASSWORD"])))
    cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), sql.Identifier(role)))
    # What an earlier version created in it as postgres (oid 10, the bootstrap superuser): its schemas, then
    # tables, views and sequences of their own (a sequence a column owns follows its table), then routines.
    system = "n.nspname NOT LIKE $$pg\\_%$$ AND n.nspname <> $$information_schema$$"
    cur.execute(f"SELECT n.nspname FROM pg_namespace n WHERE n.nspowner = 10 AND {system} AND n.nspname <> $$public$$")
    for (schema,) in cur.fetchall():
        cur.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
    kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE", "f": "FOREIGN TABLE"}
    cur.execute(f"""SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.relowner = 10 AND c.relkind IN ($$r$$, $$p$$, $$v$$, $$m$$, $$S$$, $$f$$) AND {system}
                    AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = $$pg_class$$::regclass
                                    AND d.objid = c.oid AND d.deptype IN ($$a$$, $$i$$))""")
    for schema, name, kind in cur.fetchall():
        cur.execute(sql.SQL("ALTER " + kinds[kind] + " {}.{} OWNER TO {}").format(
            sql.Identifier(schema), sql.Identifier(name), sql.Identifier(role)))
    cur.execute(f"""SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                    WHERE p.proowner = 10 AND {system}""")
    for (routine,) in cur.fetchall():
        cur.execute(sql.SQL("ALTER ROUTINE " + routine + " OWNER TO {}").format(sql.Identifier(role)))
conn.close()
' "$APP_ROLE" "$DB_NAME" || die "could not set up the role $APP_ROLE"
    if hba_trusts "$data"; then
        log "ending trust authentication of the private cluster (scram-sha-256 from now on)"
        as_owner sed -E -i 's/^([[:space:]]*[^#[:space:]].*[[:space:]])trust([[:space:]]*)$/\1scram-sha-256\2/' \
            "$data/pg_hba.conf"
        as_owner "$BINDIR/pg_ctl" -D "$data" reload >/dev/null || die "could not reload the private cluster"
    fi
}

private_running_port() {
    # prints the port of a running private cluster, or fails
    local data="$1"
    [[ -n "$BINDIR" && -f "$data/PG_VERSION" ]] || return 1
    as_owner "$BINDIR/pg_ctl" -D "$data" status >/dev/null 2>&1 || return 1
    sed -n 4p "$data/postmaster.pid" 2>/dev/null
}

start_private() {
    [[ -n "$BINDIR" ]] || no_binaries_message
    ensure_os_user
    local dir data port
    dir="$(resolve_pg_dir)"
    data="$dir/data"
    mkdir -p "$dir"
    is_root && chown "$PG_OS_USER:" "$dir"

    ensure_pgpass "$dir"
    if [[ ! -f "$data/PG_VERSION" ]]; then
        log "initialising a private PostgreSQL cluster in $data ($BINDIR), password authentication"
        local pwfile="$dir/.initdb-password"  # the superuser's password for initdb, readable by the owner only
        password_of "$dir" postgres >"$pwfile"
        if is_root; then chown "$PG_OS_USER:" "$pwfile"; fi
        if ! as_owner "$BINDIR/initdb" -D "$data" -U postgres --pwfile="$pwfile" --auth=scram-sha-256 \
                -E UTF8 --no-locale >"$dir/initdb.log" 2>&1; then
            rm -f "$pwfile"
            cat "$dir/initdb.log" >&2
            die "initdb failed"
        fi
        rm -f "$pwfile"
        cat >>"$data/postgresql.conf" <<EOF

# --- Tandem private cluster ---
listen_addresses = '$PG_LISTEN'
unix_socket_directories = ''
max_connections = 200
password_encryption = 'scram-sha-256'
EOF
        if [[ "$PG_LISTEN" != "127.0.0.1" ]]; then
            echo "host all all samenet scram-sha-256" >>"$data/pg_hba.conf"
        fi
    fi

    if port="$(private_running_port "$data")" && [[ -n "$port" ]]; then
        [[ "$port" == "$PG_PORT" ]] || log "private cluster already runs on port $port; using it"
    else
        # keep the port the cluster was created with unless TANDEM_PG_PORT says otherwise
        port="$PG_PORT"
        if [[ -z "${TANDEM_PG_PORT:-}" && -s "$dir/port" ]]; then port="$(cat "$dir/port")"; fi
        log "starting the private PostgreSQL cluster on $PG_LISTEN:$port"
        if ! as_owner "$BINDIR/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 \
                -o "-p $port" start >/dev/null 2>&1; then
            tail -n 20 "$dir/postgres.log" >&2 || true
            die "could not start the private cluster on port $port (is the port taken? set TANDEM_PG_PORT)"
        fi
    fi
    echo "$port" >"$dir/port"
    local isready
    isready="$(client pg_isready)" || isready="$BINDIR/pg_isready"
    local i
    for i in $(seq 1 30); do
        "$isready" -q -h "$PG_LISTEN" -p "$port" && break
        sleep 1
    done
    secure_private "$dir" "$data" "$port"
    echo "postgresql://$APP_ROLE:$(password_of "$dir" "$APP_ROLE")@$PG_LISTEN:$port/$DB_NAME"
}

private_data_dir() {  # fails on a link this script did not make
    local target
    if [[ -L "$PG_DIR" ]]; then target="$(own_link_target)" || return 1; echo "$target/data"
    else echo "$PG_DIR/data"; fi
}

# --- commands -----------------------------------------------------------------------------------

cmd_ensure() {
    find_store_python
    if [[ -n "${TANDEM_DATABASE_URL:-}" ]]; then
        try_connect "$TANDEM_DATABASE_URL" \
            || die "TANDEM_DATABASE_URL ($(redacted "$TANDEM_DATABASE_URL")) does not connect (reason above). Fix the URL or unset it to let Tandem provision PostgreSQL."
        log "using TANDEM_DATABASE_URL ($(redacted "$TANDEM_DATABASE_URL"))"
        echo "$TANDEM_DATABASE_URL"
        return
    fi
    local data
    data="$(private_data_dir)" || exit 1
    if [[ -f "$data/PG_VERSION" ]]; then
        start_private
        return
    fi
    local isready
    if [[ "${TANDEM_PG_SKIP_LOCAL:-0}" != "1" ]] && isready="$(client pg_isready)" \
            && "$isready" -q -h 127.0.0.1 -p 5432; then
        ensure_db "postgresql://postgres@127.0.0.1:5432"
        log "using the PostgreSQL server on 127.0.0.1:5432"
        echo "postgresql://postgres@127.0.0.1:5432/$DB_NAME"
        return
    fi
    start_private
}

cmd_status() {
    local data port
    data="$(private_data_dir)" || exit 1
    if [[ ! -f "$data/PG_VERSION" ]]; then echo "no private cluster ($data)"; return 0; fi
    if port="$(private_running_port "$data")"; then
        echo "private cluster $data: running on $PG_LISTEN:$port"
    else
        echo "private cluster $data: stopped"
    fi
}

cmd_stop() {
    local data
    data="$(private_data_dir)" || exit 1
    if [[ -f "$data/PG_VERSION" ]] && private_running_port "$data" >/dev/null; then
        log "stopping the private cluster ($data)"
        as_owner "$BINDIR/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
    fi
}

cmd_destroy() {
    local real
    if [[ -L "$PG_DIR" ]] && ! real="$(own_link_target 2>/dev/null)"; then
        rm -f "$PG_DIR"
        log "removed the link $PG_DIR (this script did not make it: what it names is left alone)"
        return
    fi
    cmd_stop
    if [[ -L "$PG_DIR" ]]; then
        rm -f "$PG_DIR"
        rm -rf "$real"
    fi
    rm -rf "$PG_DIR"
    log "removed $PG_DIR"
}

case "${1:-ensure}" in
    ensure) cmd_ensure ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    destroy) cmd_destroy ;;
    *) echo "usage: $0 [ensure|status|stop|destroy]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The documentation site's tools (requirements-docs.txt: mkdocs, mkdocs-material, mkdocstrings) into .venv.
# Idempotent: skipped when .tandem/.docs-installed-<sha of requirements-docs.txt + constraints.txt> exists and
# mkdocs runs; TANDEM_FORCE_INSTALL=1 installs again. Needs the venv of `make setup`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$ROOT/.tandem"
VENV="$ROOT/.venv"
log() { printf '[install_docs_tools] %s\n' "$*" >&2; }

[[ -x "$VENV/bin/python" ]] || { log "ERROR: no .venv: run 'make setup' first"; exit 1; }
mkdir -p "$STATE"
exec 8>"$STATE/docs-tools.lock"  # one install at a time (parallel make targets in one checkout)
flock -w 900 8 || { log "ERROR: another install holds .tandem/docs-tools.lock"; exit 1; }

SHA="$(cat requirements-docs.txt constraints.txt | sha256sum | cut -c1-16)"
STAMP="$STATE/.docs-installed-$SHA"
if [[ -f "$STAMP" && -x "$VENV/bin/mkdocs" && "${TANDEM_FORCE_INSTALL:-0}" != "1" ]]; then
    exit 0
fi
# uv as scripts/setup.sh uses it (on PATH, or the one set-up installed into .venv), else pip
UV="$(command -v uv || true)"
[[ -n "$UV" || ! -x "$VENV/bin/uv" ]] || UV="$VENV/bin/uv"
[[ "${TANDEM_INSTALLER:-}" != "pip" ]] || UV=""
if [[ -n "$UV" && -n "${PIP_INDEX_URL:-}" && -z "${UV_DEFAULT_INDEX:-}${UV_INDEX_URL:-}" ]]; then
    export UV_DEFAULT_INDEX="$PIP_INDEX_URL"  # uv reads no pip configuration
fi
log "installing the documentation tools into .venv (${UV:+uv }pip install -r requirements-docs.txt -c constraints.txt)"
if [[ -n "$UV" ]]; then
    "$UV" pip install --quiet --python "$VENV/bin/python" -r requirements-docs.txt -c constraints.txt
else
    "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check -q \
        -r requirements-docs.txt -c constraints.txt
fi
rm -f "$STATE"/.docs-installed-*
touch "$STAMP"

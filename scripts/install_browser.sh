#!/usr/bin/env bash
# Debian's chromium for the browser tests (Playwright drives it by executable_path; no browser is
# ever downloaded). Idempotent: does nothing when /usr/bin/chromium runs.
set -euo pipefail
log() { printf '[install_browser] %s\n' "$*" >&2; }

if /usr/bin/chromium --version >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    log "chromium is missing and this is not a Debian/Ubuntu machine: install Chromium at /usr/bin/chromium"
    exit 1
fi
SUDO=()
[[ "$(id -u)" == 0 ]] || SUDO=(sudo)
log "installing Debian's chromium (apt-get, a few minutes)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq >/dev/null || log "apt-get update failed: trying the package lists there are"
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
/usr/bin/chromium --version >&2

#!/usr/bin/env bash
# Debian packages the tests drive: chromium for the browser tests (Playwright drives it by
# executable_path; no browser is ever downloaded), iproute2 (`ip netns`, veth, bridges) and
# util-linux (`unshare`) for the multi-host tests, prometheus (with promtool) and prometheus-alertmanager for
# the alert rules' tests. Idempotent: installs only what is missing.
set -euo pipefail
log() { printf '[install_test_tools] %s\n' "$*" >&2; }

missing=()
/usr/bin/chromium --version >/dev/null 2>&1 || missing+=(chromium)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null; then
    log "missing ${missing[*]} and this is not a Debian/Ubuntu machine: install them (chromium at /usr/bin/chromium)"
    exit 1
fi
SUDO=()
[[ "$(id -u)" == 0 ]] || SUDO=(sudo)
log "installing Debian's ${missing[*]} (apt-get, a few minutes)"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq >/dev/null || log "apt-get update failed: trying the package lists there are"
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
/usr/bin/chromium --version >&2

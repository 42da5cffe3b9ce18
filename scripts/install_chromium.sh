#!/usr/bin/env bash
# Headless Chromium and its driver (Debian/Ubuntu packages `chromium` and `chromium-driver`): the viewer's tests open
# the generated site in it, and the GUI environment (miniwob) drives it through Selenium, which is never allowed to
# download a driver. Installs what is missing; a no-op when both are on PATH (or VERL_MM_TOOLS_CHROMIUM and
# VERL_MM_TOOLS_CHROMEDRIVER point at them).
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
browser=${VERL_MM_TOOLS_CHROMIUM:-}
driver=${VERL_MM_TOOLS_CHROMEDRIVER:-}
if { [ -n "$browser" ] || have chromium || have chromium-browser; } && { [ -n "$driver" ] || have chromedriver; }; then
  exit 0
fi
run() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
run apt-get update -qq
DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq chromium chromium-driver >/dev/null
have chromium && have chromedriver

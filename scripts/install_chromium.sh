#!/usr/bin/env bash
# The viewer tests open the generated site in a real headless Chromium (Debian/Ubuntu package `chromium`).
# Installs it when missing; a no-op when it is already on PATH or VERL_MM_TOOLS_CHROMIUM points at a browser.
set -euo pipefail
if [ -n "${VERL_MM_TOOLS_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
run() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
run apt-get update -qq
DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null

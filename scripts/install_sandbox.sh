#!/usr/bin/env bash
# The python tool runs model-written code in a bubblewrap sandbox (Debian/Ubuntu package `bubblewrap`; as root it also
# uses `setpriv` from util-linux). Installs bubblewrap when missing; a no-op when `bwrap` is already on PATH.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
run() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
run apt-get update -qq
DEBIAN_FRONTEND=noninteractive run apt-get install -y -qq bubblewrap >/dev/null
command -v bwrap >/dev/null

#!/usr/bin/env bash
# Make sure a Chromium is there for the browser tests (Playwright drives the system one: it
# cannot download its own browsers here). Installs Debian's package when missing and root.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium.sh: no chromium, and no root apt-get to install it: the browser test will fail" >&2
  exit 0
fi
echo "chromium.sh: installing Debian's chromium for the browser tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }
command -v chromium >/dev/null 2>&1 || { echo "chromium.sh: chromium did not install" >&2; exit 1; }

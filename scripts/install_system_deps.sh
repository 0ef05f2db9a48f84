#!/usr/bin/env bash
# perf_analyzer 2.51 (from the tritonclient wheel) links libb64.so.0d, which Debian ships as
# libb64-0d. Install it when missing; without root, say what to run instead of failing the setup.
set -euo pipefail
if ldconfig -p 2>/dev/null | grep -q "libb64.so.0d"; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null; }
  ldconfig -p | grep -q "libb64.so.0d" && exit 0
fi
echo "install_system_deps: libb64.so.0d is missing; perf_analyzer needs it: sudo apt-get install libb64-0d" >&2

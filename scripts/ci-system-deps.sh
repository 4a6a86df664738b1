#!/usr/bin/env bash
# System packages the tests need beyond the virtualenv; idempotent (installs only what is missing).
#   prometheus      - the live dashboard test starts a real Prometheus (tests/stack/test_live_prometheus.py)
#   docker-compose  - validates compose.yaml offline (`docker-compose config -q`; no Docker engine needed)
set -euo pipefail
need=()
command -v prometheus > /dev/null || need+=(prometheus)
command -v docker-compose > /dev/null || docker compose version > /dev/null 2>&1 || need+=(docker-compose)
if (( ${#need[@]} == 0 )); then
  echo "system deps present"
  exit 0
fi
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
# Debian's package may start a system Prometheus where an init system runs; the tests start their own.
if command -v systemctl > /dev/null && systemctl is-active --quiet prometheus 2> /dev/null; then
  $SUDO systemctl disable --now prometheus
fi
echo "installed: ${need[*]}"

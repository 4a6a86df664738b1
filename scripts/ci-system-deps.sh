#!/usr/bin/env bash
# System packages the tests need beyond the virtualenv. Installs only what is missing, says what and why before it
# does (apt-get, through sudo when not root), and leaves no service enabled or running that was not before.
#   prometheus      - the live dashboard test starts a real Prometheus (tests/stack/test_live_prometheus.py)
#   docker-compose  - validates compose.yaml offline (`docker-compose config -q`; no Docker engine needed)
# The Compose stack test's own packages (podman, runc, mmdebstrap, docker-compose) come from scripts/podman-host.sh.
set -euo pipefail
need=()
why=()
if ! command -v prometheus > /dev/null; then
  need+=(prometheus); why+=("prometheus (the live dashboard test starts one)")
fi
if ! command -v docker-compose > /dev/null && ! docker compose version > /dev/null 2>&1; then
  need+=(docker-compose); why+=("docker-compose (checks compose.yaml offline)")
fi
if (( ${#need[@]} == 0 )); then
  echo "system packages: all present (prometheus, docker-compose)"
  exit 0
fi
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"
echo "system packages: installing ${why[*]} with ${SUDO:+sudo }apt-get"
# a service the package would start is the tests' to start: note what was enabled or running before
systemd=false
[[ -d /run/systemd/system ]] && systemd=true
enabled_before=false
$systemd && systemctl is-enabled --quiet prometheus 2> /dev/null && enabled_before=true
running_before=false
pgrep -x prometheus > /dev/null && running_before=true
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
if $systemd && ! $enabled_before && systemctl is-enabled --quiet prometheus 2> /dev/null; then
  echo "system packages: disabling the prometheus service the package enabled (the tests start their own)"
  $SUDO systemctl disable --now prometheus
fi
if ! $running_before && pgrep -x prometheus > /dev/null; then
  echo "system packages: stopping the prometheus service the package started"
  if $systemd; then $SUDO systemctl stop prometheus; else $SUDO service prometheus stop || $SUDO pkill -x prometheus; fi
fi
echo "system packages: installed ${need[*]}"

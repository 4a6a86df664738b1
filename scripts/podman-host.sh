#!/usr/bin/env bash
# Make a machine without a Docker daemon run the Compose stack with podman (Debian packages; idempotent).
#   - installs podman, runc, mmdebstrap (local base images) and docker-compose 1.29 (Compose client)
#   - containers.conf: runtime runc (crun refuses hybrid cgroup v1+v2 VMs), nofile/nproc limits the VM allows
#   - starts podman's Docker-compatible API on unix:///run/podman/podman.sock (once; kept running)
# Prints the DOCKER_HOST line to export. Nothing here is needed on a host with Docker.
set -euo pipefail
SOCK=${PODMAN_SOCK:-/run/podman/podman.sock}
if docker info > /dev/null 2>&1; then
  echo "a Docker engine answers: nothing to do"
  exit 0
fi
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"
need=()
for cmd in podman runc mmdebstrap docker-compose; do
  command -v "$cmd" > /dev/null || need+=("$cmd")
done
if (( ${#need[@]} > 0 )); then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" uidmap slirp4netns fuse-overlayfs
fi
conf=/etc/containers/containers.conf
if ! grep -q '^runtime = "runc"' "$conf" 2> /dev/null; then
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n' \
    | $SUDO tee "$conf" > /dev/null
fi
if ! curl -fsS --unix-socket "$SOCK" http://d/_ping > /dev/null 2>&1; then
  $SUDO mkdir -p "$(dirname "$SOCK")"
  # setsid: the API service outlives this script (it is the engine, like dockerd); `podman-host.sh --stop` ends it
  setsid $SUDO podman system service --time=0 "unix://$SOCK" > /tmp/podman-service.log 2>&1 < /dev/null &
  for _ in $(seq 50); do curl -fsS --unix-socket "$SOCK" http://d/_ping > /dev/null 2>&1 && break; sleep 0.2; done
fi
curl -fsS --unix-socket "$SOCK" http://d/_ping > /dev/null || { echo "podman API did not start: /tmp/podman-service.log" >&2; exit 1; }
echo "export DOCKER_HOST=unix://$SOCK"

#!/usr/bin/env bash
# Run the Compose stack on a machine without a Docker daemon, with podman (Debian packages; idempotent).
#   scripts/podman-host.sh start   install what is missing, configure, start the API; prints the DOCKER_HOST line
#   scripts/podman-host.sh stop    stop the API service and the health ticker it started (containers are untouched)
# - installs podman, runc, mmdebstrap (local base images: scripts/local-images.sh), docker-compose 1.29 and the
#   CNI dnsname plugin (containers find each other by service name)
# - containers.conf: runtime runc (crun refuses the VM's hybrid cgroup v1+v2), nofile/nproc limits the VM allows
# - podman's Docker-compatible API on unix:///run/podman/podman.sock, the engine docker-compose talks to
# - a health ticker: podman runs health checks from systemd timers; without systemd (containers, CI VMs) nothing
#   runs them and `depends_on: condition: service_healthy` would wait forever, so the ticker runs
#   `podman healthcheck run` for every running container that has one, every 5 s.
# Nothing here is needed on a host with Docker: start exits at once when a Docker engine answers.
set -euo pipefail
SOCK=${PODMAN_SOCK:-/run/podman/podman.sock}
STATE=/run/draftsmith-podman
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"

alive() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2> /dev/null; }

case "${1:-start}" in
  stop)
    for name in health-ticker podman-service; do
      if alive "$name"; then $SUDO kill -- "-$(cat "$STATE/$name.pid")" 2> /dev/null || true; fi
      $SUDO rm -f "$STATE/$name.pid"
    done
    echo "podman API and health ticker stopped"
    exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

if [[ -z "${DOCKER_HOST:-}" ]] && docker info > /dev/null 2>&1; then
  echo "a Docker engine answers: nothing to do"
  exit 0
fi
need=()
for cmd in podman runc mmdebstrap docker-compose; do
  command -v "$cmd" > /dev/null || need+=("$cmd")
done
# podman 4.3 on Debian uses CNI networks; without the dnsname plugin they have no DNS, and a container cannot
# reach another by service name (the generator fails "redis: Name or service not known")
[[ -x /usr/lib/cni/dnsname ]] || need+=(golang-github-containernetworking-plugin-dnsname)
if (( ${#need[@]} > 0 )); then
  echo "podman-host: installing ${need[*]} (a container engine for the Compose stack) with ${SUDO:+sudo }apt-get"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" uidmap slirp4netns
fi
conf=/etc/containers/containers.conf
if ! grep -q '^runtime = "runc"' "$conf" 2> /dev/null; then
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n' \
    | $SUDO tee "$conf" > /dev/null
fi
$SUDO mkdir -p "$STATE" "$(dirname "$SOCK")"
# setsid: both outlive this script (they are the engine, like dockerd); `stop` ends their process groups
if ! alive podman-service; then
  setsid $SUDO podman system service --time=0 "unix://$SOCK" > "$STATE/podman-service.log" 2>&1 < /dev/null &
  echo $! | $SUDO tee "$STATE/podman-service.pid" > /dev/null
fi
if ! alive health-ticker; then
  setsid bash -c 'while sleep 5; do
      for c in $(podman ps -q --filter health=starting --filter health=healthy --filter health=unhealthy); do
        podman healthcheck run "$c" > /dev/null 2>&1 || true
      done
    done' > /dev/null 2>&1 < /dev/null &
  echo $! | $SUDO tee "$STATE/health-ticker.pid" > /dev/null
fi
for _ in $(seq 100); do curl -fsS --unix-socket "$SOCK" http://d/_ping > /dev/null 2>&1 && break; sleep 0.2; done
curl -fsS --unix-socket "$SOCK" http://d/_ping > /dev/null \
  || { echo "podman API did not start: $STATE/podman-service.log" >&2; exit 1; }
echo "export DOCKER_HOST=unix://$SOCK"

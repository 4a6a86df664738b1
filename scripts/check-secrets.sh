#!/usr/bin/env bash
# Refuse to start the Compose stack without its required settings: prints the missing ones and exits 2.
# Usage: scripts/check-secrets.sh [ENV_FILE]   (default .env). The file is read, never sourced (no code runs).
set -euo pipefail
env_file="${1:-.env}"
required=(REDIS_PASSWORD GRAFANA_ADMIN_PASSWORD TARGET_MODEL)
secrets=(REDIS_PASSWORD GRAFANA_ADMIN_PASSWORD)
if [[ ! -f "$env_file" ]]; then
  echo "error: $env_file not found; cp .env.example $env_file and set ${required[*]}" >&2
  exit 2
fi
value_of() {  # last assignment of $1 in the env file, quotes stripped; the environment wins, as in compose
  local v
  if [[ -n "${!1:-}" ]]; then printf '%s' "${!1}"; return; fi
  v="$(grep -E "^[[:space:]]*$1=" "$env_file" | tail -n 1 | cut -d= -f2- || true)"
  v="${v%\"}"; v="${v#\"}"; v="${v%\'}"; v="${v#\'}"
  printf '%s' "$v"
}
missing=()
for name in "${required[@]}"; do
  [[ -n "$(value_of "$name")" ]] || missing+=("$name")
done
if (( ${#missing[@]} )); then
  echo "error: required settings empty in $env_file: ${missing[*]} (see .env.example; secrets: openssl rand -hex 24)" >&2
  exit 2
fi
# weak: shorter than 12, a common word inside (any case), fewer than 6 different characters, or a short piece
# repeated (passwordpassword, abcabcabcabc)
common='password|passwd|passw0rd|changeme|change-me|admin|secret|redis|grafana|default|letmein|qwerty|welcome|123456|abc123|example|draftsmith'
is_weak() {
  local v="$1" lower="${1,,}" distinct unit
  (( ${#v} >= 12 )) || return 0
  [[ "$lower" =~ ($common) ]] && return 0
  distinct="$(printf '%s' "$v" | fold -w1 | sort -u | wc -l)"
  (( distinct >= 6 )) || return 0
  for (( n = 1; n <= ${#v} / 2; n++ )); do
    (( ${#v} % n == 0 )) || continue
    unit="${v:0:n}"
    local rep="" i
    for (( i = 0; i < ${#v} / n; i++ )); do rep+="$unit"; done
    [[ "$rep" == "$v" ]] && return 0
  done
  return 1
}
weak=()
for name in "${secrets[@]}"; do
  is_weak "$(value_of "$name")" && weak+=("$name")
done
if (( ${#weak[@]} )); then
  echo "error: weak secrets in $env_file: ${weak[*]} (use 12+ random characters, no words: openssl rand -hex 24)" >&2
  exit 2
fi
if [[ "$(value_of REDIS_PASSWORD)" == "$(value_of GRAFANA_ADMIN_PASSWORD)" ]]; then
  echo "error: REDIS_PASSWORD and GRAFANA_ADMIN_PASSWORD in $env_file are the same; give each its own (openssl rand -hex 24)" >&2
  exit 2
fi
# the password goes into redis://:<password>@redis URLs: keep it URL-safe
if [[ ! "$(value_of REDIS_PASSWORD)" =~ ^[A-Za-z0-9._~-]+$ ]]; then
  echo "error: REDIS_PASSWORD in $env_file must be URL-safe (letters, digits, . _ ~ -): openssl rand -hex 24" >&2
  exit 2
fi
REDIS_PASSWORD_VALUE="$(value_of REDIS_PASSWORD)"
# Redis published beyond this host (workers elsewhere, docs/gpu-host.md): a guessable password is a remote shell on
# the queue, so demand a long one
bind="$(value_of REDIS_BIND)"
if [[ -n "$bind" && "$bind" != "127.0.0.1" && "$bind" != "localhost" && "$bind" != "::1" ]]; then
  if (( ${#REDIS_PASSWORD_VALUE} < 32 )); then
    echo "error: REDIS_BIND=$bind publishes Redis beyond this host; REDIS_PASSWORD in $env_file must then be 32+ characters (openssl rand -hex 24), and rediss:// (TLS) is advised across networks you do not own (docs/gpu-host.md)" >&2
    exit 2
  fi
fi
# the s3 profile's store: both keys or neither, and a strong secret
if [[ -n "$(value_of S3_ACCESS_KEY)$(value_of S3_SECRET_KEY)" ]]; then
  if [[ -z "$(value_of S3_ACCESS_KEY)" || -z "$(value_of S3_SECRET_KEY)" ]] || is_weak "$(value_of S3_SECRET_KEY)"; then
    echo "error: S3_ACCESS_KEY and S3_SECRET_KEY in $env_file must both be set, the secret 12+ random characters (openssl rand -hex 24)" >&2
    exit 2
  fi
fi
echo "secrets ok ($env_file)"

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
weak=()
for name in "${secrets[@]}"; do
  v="$(value_of "$name")"
  case "${v,,}" in
    changeme|change-me|password|admin|secret|redis|grafana|default) weak+=("$name") ;;
  esac
  (( ${#v} >= 12 )) || weak+=("$name")
done
if (( ${#weak[@]} )); then
  echo "error: weak secrets in $env_file: ${weak[*]} (use 12+ random characters: openssl rand -hex 24)" >&2
  exit 2
fi
# the password goes into redis://:<password>@redis URLs: keep it URL-safe
if [[ ! "$(value_of REDIS_PASSWORD)" =~ ^[A-Za-z0-9._~-]+$ ]]; then
  echo "error: REDIS_PASSWORD in $env_file must be URL-safe (letters, digits, . _ ~ -): openssl rand -hex 24" >&2
  exit 2
fi
echo "secrets ok ($env_file)"

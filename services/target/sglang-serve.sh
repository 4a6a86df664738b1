#!/bin/sh
# Start the official SGLang server on the mounted target checkpoint (compose service `target-sglang`).
# --enable-metrics exports sglang:* on /metrics. With DRAFTER_DIR set, the EAGLE-3 drafter runs as a chain of
# NUM_SPECULATIVE_TOKENS steps (topk 1, draft tokens = steps + 1), the same setting as vLLM's num_speculative_tokens.
set -eu
model="${MODELS_ROOT:-/models}/${TARGET_MODEL:?set TARGET_MODEL in .env}"
if [ ! -f "$model/config.json" ]; then
  echo "error: no checkpoint at $model (config.json missing); download it into MODELS_DIR (docs/gpu-host.md)" >&2
  exit 2
fi
set -- --model-path "$model" --served-model-name "${SERVED_MODEL_NAME:-target}" --host 0.0.0.0 --port 8000 \
  --tp-size "${TENSOR_PARALLEL_SIZE:-1}" --context-length "${MAX_MODEL_LEN:-8192}" --enable-metrics
if [ -n "${DRAFTER_DIR:-}" ]; then
  if [ ! -f "$DRAFTER_DIR/config.json" ]; then
    echo "error: DRAFTER_DIR=$DRAFTER_DIR has no config.json; run \`draftsmith export\` first" >&2
    exit 2
  fi
  k="${NUM_SPECULATIVE_TOKENS:-3}"
  set -- "$@" --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFTER_DIR" \
    --speculative-num-steps "$k" --speculative-eagle-topk 1 --speculative-num-draft-tokens "$((k + 1))"
fi
# What the target needs (`draftsmith target flags` derives it from the checkpoint; docs/targets.md): its own code,
# the parsers that split reasoning and tool calls from the answer (the same names in both engines).
if [ "${TRUST_REMOTE_CODE:-0}" = "1" ]; then set -- "$@" --trust-remote-code; fi
if [ -n "${REASONING_PARSER:-}" ]; then set -- "$@" --reasoning-parser "$REASONING_PARSER"; fi
if [ -n "${TOOL_CALL_PARSER:-}" ]; then set -- "$@" --tool-call-parser "$TOOL_CALL_PARSER"; fi
# SGLANG_EXTRA_ARGS (this engine only) and TARGET_EXTRA_ARGS (both engines) are split on spaces on purpose.
# shellcheck disable=SC2086
exec python3 -m sglang.launch_server "$@" ${SGLANG_EXTRA_ARGS:-} ${TARGET_EXTRA_ARGS:-}

#!/bin/sh
# Start the official vLLM OpenAI server on the mounted target checkpoint (compose service `target-vllm`).
# With DRAFTER_DIR set (a folder under /runs, e.g. /runs/demo/export/eagle3) the EAGLE-3 drafter is loaded with
# NUM_SPECULATIVE_TOKENS chain tokens; vLLM then exports the vllm:spec_decode_* counters on /metrics.
# The official image has no draftsmith to build this command, so it is written here; the flags it shares with
# draftsmith's own server command (draftsmith.target.server.VLLMServerSpec, eagle3_config) must say the same
# (tests/stack/test_compose.py::test_vllm_launch_script_agrees_with_the_server_spec).
set -eu
model="${MODELS_ROOT:-/models}/${TARGET_MODEL:?set TARGET_MODEL in .env}"
if [ ! -f "$model/config.json" ]; then
  echo "error: no checkpoint at $model (config.json missing); download it into MODELS_DIR (docs/gpu-host.md)" >&2
  exit 2
fi
set -- --model "$model" --served-model-name "${SERVED_MODEL_NAME:-target}" --host 0.0.0.0 --port 8000 \
  --tensor-parallel-size "${TENSOR_PARALLEL_SIZE:-1}" --max-model-len "${MAX_MODEL_LEN:-8192}"
if [ -n "${DRAFTER_DIR:-}" ]; then
  if [ ! -f "$DRAFTER_DIR/config.json" ]; then
    echo "error: DRAFTER_DIR=$DRAFTER_DIR has no config.json; run \`draftsmith export\` first" >&2
    exit 2
  fi
  set -- "$@" --speculative-config \
    "{\"method\":\"eagle3\",\"model\":\"$DRAFTER_DIR\",\"num_speculative_tokens\":${NUM_SPECULATIVE_TOKENS:-3}}"
fi
# What the target needs (`draftsmith target flags` derives it from the checkpoint; docs/targets.md): its own code,
# the parsers that split reasoning and tool calls from the answer (the same names in both engines).
if [ "${TRUST_REMOTE_CODE:-0}" = "1" ]; then set -- "$@" --trust-remote-code; fi
if [ -n "${REASONING_PARSER:-}" ]; then set -- "$@" --reasoning-parser "$REASONING_PARSER"; fi
if [ -n "${TOOL_CALL_PARSER:-}" ]; then set -- "$@" --tool-call-parser "$TOOL_CALL_PARSER"; fi
# VLLM_EXTRA_ARGS (this engine only) and TARGET_EXTRA_ARGS (both engines) are split on spaces on purpose
# (e.g. "--enable-expert-parallel --gpu-memory-utilization 0.9").
# The project image (vLLM's CPU build, the stand-in where the official image cannot run) starts vLLM's server
# through draftsmith's launcher, which lets its CPU attention serve an EAGLE-3 drafter on an MLA target
# (draftsmith.target.vllm_launch); the official image has no draftsmith and starts vLLM's own entry point.
entry=vllm.entrypoints.openai.api_server
if command -v draftsmith > /dev/null; then entry=draftsmith.target.vllm_launch; fi
# shellcheck disable=SC2086
exec python3 -m "$entry" "$@" ${VLLM_EXTRA_ARGS:-} ${TARGET_EXTRA_ARGS:-}

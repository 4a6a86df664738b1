#!/usr/bin/env bash
# The GPU checks of extraction and training at scale, as one short run on a GPU host (everything here is built and
# tested on CPU first; this script answers what only a GPU can). Prints the same RATIO lines as the CPU benchmarks:
#   RATIO extraction_vs_prefill   vllm backend extraction vs vLLM's own prefill (bench/extraction.py --vllm)
#   RATIO extraction_queue        one resident extractor worker vs extract --sync, TARGET_LOADS (bench/extraction_scale.py)
#   RATIO ttt_memory_linear / ttt_memory_8b / ttt_speed_512   TTT step memory and speed (bench/ttt_memory.py --device cuda)
#   LONG_CONTEXT                  build-data, extract and train at 8,192 tokens per sample (bench/long_context.py)
#   FAMILY                        which drafter families vLLM serves: load, draft, identical (bench/family_probe.py)
# Usage: scripts/gpu-check.sh [TP]    TP = tensor-parallel ranks for extraction (default: every visible GPU that
# divides the target's attention heads; the embedded target has 9 heads, so 1, 3 or 9).
# Needs: the venv with a CUDA torch and the GPU vLLM (`make venv` on the GPU host), nvidia-smi.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
command -v nvidia-smi > /dev/null || { echo "gpu-check: no nvidia-smi: not a GPU host" >&2; exit 2; }
gpus=$(nvidia-smi -L | wc -l)
tp=${1:-}
if [[ -z $tp ]]; then
  tp=1
  for n in 9 3; do (( gpus >= n )) && { tp=$n; break; }; done
fi
echo "gpu-check: $gpus GPU(s): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | xargs)"
echo "gpu-check: extraction with tensor parallel $tp"
$PY -m draftsmith target prepare > /dev/null
export DRAFTSMITH_EXTRACT__DEVICE=cuda
step() { echo "== $*"; "$@" 2>&1 | grep -E '^(RATIO|INTERVAL|TARGET_LOADS|LONG_CONTEXT|CPU_PER_REQUEST|FAMILY)|tok(ens)?/s|peak|step ' || true; }
DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE=$tp step $PY bench/extraction.py --vllm --samples 64 --length 1024
step $PY bench/extraction_scale.py --backend vllm --tensor-parallel-size "$tp" --shards 8 --shard-samples 16 --length 1024
step $PY bench/ttt_memory.py --device cuda
step $PY bench/long_context.py --length 8192 --samples 8 --steps 8
step $PY bench/family_probe.py

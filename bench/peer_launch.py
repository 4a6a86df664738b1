"""Run speculators' trainer (``python -m speculators.train ARGS``) with Muon's arithmetic as draftsmith's on this CPU.

Both trainers use PyTorch's ``torch.optim.Muon``, whose Newton-Schulz iteration runs in bf16. On a CPU without bf16
kernels draftsmith runs that iteration in float32 instead (``shared/draftsmith/drafter/newton_schulz.py``: about 50x
faster per optimizer step there, the same iteration up to bf16 rounding); this launcher gives the peer the same, so
that the comparison trains both sides with one arithmetic and neither waits an hour per epoch. Where the CPU has bf16
kernels, or CUDA is present, it changes nothing. Runs in ``.peer-venv`` (no draftsmith there): the two torch-only
modules are loaded from their files.

    .peer-venv/bin/python bench/peer_launch.py --speculator-type eagle3 ...   (what bench/peer_speculators.py runs)
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "shared" / "draftsmith"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


USAGE = "usage: peer_launch.py SPECULATORS_TRAIN_ARGS...  (run by .peer-venv/bin/python; --help: speculators' own)"


def main() -> None:
    if importlib.util.find_spec("speculators") is None:  # not the peer's venv
        print(USAGE)
        if sys.argv[1:] in (["-h"], ["--help"]):
            return
        raise SystemExit("peer_launch.py: speculators is not installed in this Python: run it with "
                         ".peer-venv/bin/python (built by scripts/peer-venv.sh)")
    import torch

    precision = _load("draftsmith_precision", PKG / "precision.py")
    ns = _load("draftsmith_newton_schulz", PKG / "drafter" / "newton_schulz.py")
    fp32 = not torch.cuda.is_available() and not precision.cpu_has_bf16_kernels()
    with ns.float32_newton_schulz(fp32) as swapped:
        print(f"peer-launch: Muon's Newton-Schulz in {'float32' if swapped else 'bf16 (torch own)'}", flush=True)
        sys.argv = ["speculators.train", *sys.argv[1:]]
        runpy.run_module("speculators.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

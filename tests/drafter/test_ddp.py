"""torchrun DDP on CPU: two gloo processes take different micro-batches yet end a step with identical weights."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_two_ranks_agree_after_a_step(reference_run, embedded_target, draft_vocab, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "ddp")
    out = tmp_path / "out"
    out.mkdir()
    worker = Path(__file__).with_name("ddp_worker.py")
    from draftsmith.target.server import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(worker), str(runs), str(embedded_target), str(draft_vocab), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads((out / "rank0.json").read_text())
    r1 = json.loads((out / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["before"] == r1["before"]  # same seed, same init
    assert r0["after"] == r1["after"]  # gradients were all-reduced
    assert r0["after"] != r0["before"]  # and a step was taken

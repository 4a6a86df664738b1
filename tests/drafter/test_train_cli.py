"""``draftsmith train`` and ``draftsmith export`` through the real console entry point."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.slow
def test_train_then_export_both_layouts(reference_run, embedded_target, draft_vocab, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "cli")
    taken = socket.create_server(("127.0.0.1", 0))  # another process's /metrics on the port train is told to use
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(embedded_target),
           "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": str(draft_vocab), "DRAFTSMITH_METRICS__PORT": str(taken.getsockname()[1]),
           "DRAFTSMITH_TRAIN__BATCH_TOKENS": "640", "DRAFTSMITH_TRAIN__BATCH_SIZE": "4"}
    # no checkpoint yet: one error line, exit code 2
    r = _cli(["export", "--run", "cli"], env)
    assert r.returncode == 2 and "no checkpoint under" in r.stderr and "Traceback" not in r.stderr
    r = _cli(["train", "--run", "cli", "--max-steps", "2", "--ttt-steps", "2"], env)
    taken.close()
    assert r.returncode == 0, r.stderr[-2000:]
    # a taken metrics port costs the live metrics, not the training: one warning naming the port and the setting
    port = env["DRAFTSMITH_METRICS__PORT"]
    assert f"warning: cannot serve /metrics on 127.0.0.1:{port}" in r.stderr and "metrics.port" in r.stderr
    # a short human summary on stdout; the figures stay in status/train.json
    assert r.stdout.startswith("trained 2 steps") and "simulated acceptance length" in r.stdout, r.stdout
    assert len(r.stdout.splitlines()) <= 3 and "status/train.json" in r.stdout
    assert json.loads((runs / "cli" / "status" / "train.json").read_text())["step"] == 2
    assert "step       2/2 epoch 0 loss" in r.stderr
    r = _cli(["export", "--run", "cli", "--format", "both"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    for layout in ("eagle3", "speculators"):
        assert (runs / "cli" / "export" / layout / "model.safetensors").is_file()
    r = _cli(["export", "--run", "cli", "--checkpoint", "step-00000099"], env)
    assert r.returncode == 2 and "no checkpoint at" in r.stderr

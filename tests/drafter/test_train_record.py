"""`make train` twice on one run, through the real console entry point: the first training records its recipe in
the run's record; a second one with another learning rate would resume the first one's checkpoint with another
recipe, so it is refused with both values, and nothing is written; starting over (`--no-resume`) records the new
recipe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


def _cli(args, env):
    return subprocess.run(
        [sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env, timeout=900
    )


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_second_train_with_another_lr_is_refused_unless_it_starts_over(
    reference_run, embedded_target, draft_vocab, tmp_path
):
    runs = tmp_path / "runs"
    root = runs / "lr"
    shutil.copytree(reference_run, root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(
        DRAFTSMITH_RUNS_DIR=str(runs),
        DRAFTSMITH_TARGET__PATH=str(embedded_target),
        DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE=str(draft_vocab),
        DRAFTSMITH_METRICS__PORT="0",
        DRAFTSMITH_TRAIN__BATCH_TOKENS="640",
        DRAFTSMITH_TRAIN__BATCH_SIZE="4",
    )
    r = _cli(["train", "--run", "lr", "--max-steps", "2", "--ttt-steps", "2", "--lr", "0.001"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((root / "run-settings.json").read_text())["sections"]
    assert rec["train"]["lr"] == 0.001 and rec["train"]["ttt_steps"] == 2 and rec["train"]["max_steps"] == 2
    before = _files(root)
    assert "checkpoints/latest.json" in before

    r = _cli(["train", "--run", "lr", "--max-steps", "4", "--lr", "0.002"], env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "train.lr: this command 0.002, run 0.001" in r.stderr
    assert "max_steps" not in r.stderr  # a resume may train longer; only the recipe is pinned
    assert "training would resume from checkpoint step-00000002" in r.stderr and "--no-resume" in r.stderr
    assert "Nothing was written" in r.stderr and "Traceback" not in r.stderr
    assert _files(root) == before

    # starting over replaces the checkpoints: the run's recipe is the new one; ttt_steps left unset is the run's
    r = _cli(["train", "--run", "lr", "--max-steps", "2", "--lr", "0.002", "--no-resume"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "continuing with the run's recorded train.ttt_steps=2" in r.stderr
    assert "the run's settings change (train.lr: 0.001 -> 0.002)" in r.stderr, r.stderr[-2000:]
    rec = json.loads((root / "run-settings.json").read_text())["sections"]
    assert rec["train"]["lr"] == 0.002 and rec["train"]["ttt_steps"] == 2
    assert json.loads((root / "status" / "train.json").read_text())["step"] == 2

"""`draftsmith train` under SIGTERM / SIGINT (a preemptible host, `docker stop`, Ctrl-C): the finished step is saved,
one line says so, and the next run resumes from it. Real processes, real SmolLM2 features."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # trains on real features (the session's reference run)


def _sighup_default() -> None:
    """Children start with SIGHUP at its default action even under ``nohup`` (which sets it to ignored, and a
    command rightly keeps an ignored SIGHUP): the tests send SIGHUP and expect it to be handled."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # SIGINT/SIGHUP reach the same StopRequest: tests/lifecycle
def test_signal_saves_a_checkpoint_and_the_next_run_resumes_from_it(sig, reference_run, embedded_target,
                                                                    draft_vocab, tmp_path):
    from draftsmith.config import load_settings
    from draftsmith.drafter.checkpoint import list_checkpoints, read_state
    from draftsmith.drafter.trainer import Trainer

    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "sig")
    env = {**os.environ, "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(embedded_target),
           "DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE": str(draft_vocab), "DRAFTSMITH_METRICS__PORT": "0",
           "DRAFTSMITH_TRAIN__BATCH_TOKENS": "640", "DRAFTSMITH_TRAIN__BATCH_SIZE": "4",
           "DRAFTSMITH_TRAIN__LOG_EVERY": "1", "DRAFTSMITH_TRAIN__EVAL_EVERY": "1000",
           "DRAFTSMITH_TARGET__API_KEY": "sk-live-4f9a8b7c6d5e3a2b"}  # must not reach state.json
    proc = subprocess.Popen(preexec_fn=_sighup_default, args=[sys.executable, "-m", "draftsmith", "train", "--run", "sig", "--max-steps", "200",
                             "--ttt-steps", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines = []
    for line in proc.stderr:  # progress lines go to stderr (the log)
        err_lines.append(line)
        if " step       2/200 " in f" {line}" or "step       2/200" in line:
            break
    else:
        pytest.fail("".join(err_lines)[-3000:])
    proc.send_signal(sig)
    out, rest = proc.communicate(timeout=300)
    err = "".join(err_lines) + rest
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {sig.name}; kept: checkpoint step-") and "/200) in " in last
    assert last.endswith(f"{runs / 'sig' / 'checkpoints'} -> run `draftsmith train --run sig` again to resume from it")
    step = int(last.split(" (step ")[1].split("/")[0])
    assert 2 <= step < 200
    ckpts = list_checkpoints(runs / "sig" / "checkpoints")
    assert [c.name for c in ckpts] == [f"step-{step:08d}"]
    assert json.loads((runs / "sig" / "checkpoints" / "latest.json").read_text())["step"] == step
    assert read_state(ckpts[0])["position"] == step  # one micro-batch per step: the step is whole
    state_text = (ckpts[0] / "state.json").read_text()
    assert "sk-live-4f9a8b7c6d5e3a2b" not in state_text and read_state(ckpts[0])["config"]["target"]["api_key"]
    s = load_settings(None, {"runs_dir": str(runs), "run": "sig", "target": {"path": str(embedded_target)},
                             "train": {"draft_vocab_size": draft_vocab, "ttt_steps": 2, "max_steps": 200,
                                       "batch_size": 4, "batch_tokens": 640}})
    resumed = Trainer(s)
    assert (resumed.step, resumed.position) == (step, step)
    assert resumed.sched.last_epoch == step

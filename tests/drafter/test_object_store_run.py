"""Training and export of a run that lives on a real S3 store (SeaweedFS), each "host" with its own empty working
copy (``stage_dir``): the checkpoints reach the store after each save, another host resumes from them, a third
exports, and the drafter equals the one trained on a local disk from the same data. A working copy pulls only the
latest checkpoint, and the store keeps as many checkpoints as the trainer keeps (``train.keep``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from draftsmith.artifacts.location import run_location
from draftsmith.drafter.trainer import Trainer
from draftsmith.staging import pull, push
from safetensors.torch import load, load_file

TRAIN = dict(batch_size=4, batch_tokens=640, eval_fraction=0.15, log_every=2,
             eval_every=1000, save_every=2, lr=1e-3, warmup_ratio=0.1)


def host(s3_runs: str, stage_dir, target, vocab: int, *cmd: str, **extra: str) -> str:
    """One `draftsmith` command as a host that shares nothing with the others but the store."""
    env = {**os.environ, **extra, "DRAFTSMITH_RUNS_DIR": s3_runs, "DRAFTSMITH_RUN": "obj",
           "DRAFTSMITH_STAGE_DIR": str(stage_dir), "DRAFTSMITH_TARGET__PATH": str(target),
           "DRAFTSMITH_METRICS__PORT": "0",
           "DRAFTSMITH_TRAIN__DRAFT_VOCAB_SIZE": str(vocab),
           **{f"DRAFTSMITH_TRAIN__{k.upper()}": str(v) for k, v in TRAIN.items()}}
    p = subprocess.run([sys.executable, "-m", "draftsmith", *cmd], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


@pytest.mark.slow
def test_a_run_on_the_store_trains_resumes_elsewhere_and_exports(reference_run, run_factory, s3_runs, tmp_path,
                                                                 embedded_target, draft_vocab):
    root = run_location(s3_runs) / "obj"
    assert push(reference_run, root, ("data", "features")) > 0  # as the extraction host left it
    host(s3_runs, tmp_path / "host-a", embedded_target, draft_vocab, "train", "--max-steps", "2")
    stored = root / "checkpoints" / "step-00000002" / "model.safetensors"
    assert stored.exists()
    # the same data on a local disk, trained in this process: the same drafter
    local = run_factory("local", **TRAIN, max_steps=2)
    trainer = Trainer(local)
    trainer.run()
    trainer.close()
    mine = load_file(str(tmp_path / "runs" / "local" / "checkpoints" / "step-00000002" / "model.safetensors"))
    theirs = load(stored.read_bytes())
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    host(s3_runs, tmp_path / "host-a", embedded_target, draft_vocab, "train", "--max-steps", "4")
    assert pull(root, tmp_path / "copy", ("checkpoints",)) > 0  # the latest checkpoint only, and its pointer
    assert sorted(p.name for p in (tmp_path / "copy" / "checkpoints").iterdir()) == ["latest.json", "step-00000004"]
    # host A is gone; host B, with an empty working copy, resumes from the store's latest checkpoint (the only one
    # it pulls), and keeps one checkpoint: the store keeps as many
    out = host(s3_runs, tmp_path / "host-b", embedded_target, draft_vocab, "train", "--max-steps", "6",
               DRAFTSMITH_TRAIN__KEEP="1")
    assert "resumed from step-00000004" in out, out[-3000:]
    # the objects, not a listing of names: SeaweedFS's filer keeps an emptied folder as a name (S3 itself does not)
    ckpts = root / "checkpoints"
    kept = {str(p)[len(ckpts.path) + 1:].split("/")[0] for p in ckpts.fs.find(ckpts.path)}
    assert kept == {"latest.json", "step-00000006"}, kept
    host(s3_runs, tmp_path / "host-c", embedded_target, draft_vocab, "export", "--run", "obj", "--format", "eagle3")
    exported = load((root / "export" / "eagle3" / "model.safetensors").read_bytes())
    assert exported and all(torch.isfinite(v.float()).all() for v in exported.values())

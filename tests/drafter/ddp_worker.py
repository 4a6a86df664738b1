"""Run by ``torchrun --nproc_per_node 2`` from test_ddp.py: a short training on CPU (gloo) with DDP or FSDP.

Each DDP rank (rank 0 under FSDP) writes a digest of the whole weights before and after; rank 0 also writes them
(``weights.safetensors``) so the test can compare DDP with FSDP and an interrupted FSDP run with a straight one.
Usage: ``ddp_worker.py RUNS_DIR RUN TARGET VOCAB OUT PARALLEL MAX_STEPS [STOP_AT]``; ``POISON_RANK=r`` gives rank r
NaN features in its first micro-batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from draftsmith.config import load_settings
from draftsmith.drafter.trainer import Trainer
from safetensors.torch import save_file


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].float().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    runs_dir, run, target, vocab, out, parallel, max_steps = sys.argv[1:8]
    stop_at = int(sys.argv[8]) if len(sys.argv) > 8 else None
    torch.set_num_threads(1)
    s = load_settings(None, {"runs_dir": runs_dir, "run": run, "target": {"path": target},
                             "train": {"draft_vocab_size": int(vocab), "ttt_steps": 2, "max_steps": int(max_steps),
                                       "batch_size": 2, "batch_tokens": 320, "eval_fraction": 0.15,
                                       "save_every": 1, "eval_every": 1000, "lr": 1e-3, "parallel": parallel,
                                       # DDP and FSDP weights are compared to 1e-6: float32 on every CPU
                                       "precision": "fp32"}})
    tr = Trainer(s)
    rank = int(os.environ["RANK"])
    if os.environ.get("POISON_RANK") == str(rank):  # this rank's first micro-batch gets NaN features
        from nan_features import NaNFeatures  # beside this script; pickles for the spawned loader workers

        tr.features = NaNFeatures(tr.features.dir, tr._rank_batches(0)[0])
    before = digest(tr.weights())  # collective under FSDP: every rank calls it; only rank 0 gets the tensors
    result = tr.run(stop_at=stop_at)
    after = tr.weights()
    if rank == 0:
        save_file(after, f"{out}/weights.safetensors")
    digests = {"before": before, "after": digest(after)} if rank == 0 or not tr.sharded else {}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"world": tr.dist.world, "sharded": tr.sharded, "step": result["step"],
                   "nan_feature_samples": tr.nan_features,
                   "start_step": tr._resume_at[0], **digests}, f)
    tr.close()


if __name__ == "__main__":
    main()

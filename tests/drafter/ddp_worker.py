"""Run by ``torchrun --nproc_per_node 2`` from test_ddp.py: one DDP training step on CPU (gloo), then each rank
writes a digest of its weights so the test can check that both ranks agree (and moved away from the init)."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from draftsmith.config import load_settings
from draftsmith.drafter.checkpoint import model_state
from draftsmith.drafter.trainer import Trainer


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].float().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    runs_dir, target, vocab, out = sys.argv[1:5]
    torch.set_num_threads(1)
    s = load_settings(None, {"runs_dir": runs_dir, "run": "ddp", "target": {"path": target},
                             "train": {"draft_vocab_size": int(vocab), "ttt_steps": 2, "max_steps": 1,
                                       "batch_size": 2, "batch_tokens": 320, "eval_fraction": 0.15,
                                       "save_every": 1000, "eval_every": 1000, "resume": False, "lr": 1e-3}})
    tr = Trainer(s)
    before = digest(model_state(tr.model))
    tr.run()
    rank = int(os.environ["RANK"])
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"before": before, "after": digest(model_state(tr.model)), "world": tr.dist.world}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

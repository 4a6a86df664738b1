"""The target loaded in-process with transformers, for the offline acceptance estimate and the peer benchmark
(the tests' reference run writer, ``tests/drafter/reference_run.py``, loads it the same way)."""

from __future__ import annotations

import torch


def load_target(target_path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False):
    """The target as a transformers causal LM in eval mode (local folder only; ``trust_remote_code`` runs the
    model code the checkpoint ships)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=dtype, local_files_only=True,
                                                 trust_remote_code=trust_remote_code)
    return model.eval()

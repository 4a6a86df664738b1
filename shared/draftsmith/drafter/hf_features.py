"""Target features computed in-process with transformers (the offline acceptance estimate, tests, the benchmark).

The tests' reference run writer (``tests/drafter/reference_run.py``) builds on these two functions.

Layer ids: output of decoder layer ``i`` = ``output_hidden_states[i + 1]`` (``draftsmith.features.layers``).
``final_hidden`` is the last decoder output after the final norm, which transformers returns as
``output_hidden_states[-1]`` for Llama-family models (checked: ``hidden_states[-1] @ lm_head.T == logits``).
"""

from __future__ import annotations

import torch

from draftsmith.features.layers import hf_hidden_index


def load_target(target_path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False):
    """The target as a transformers causal LM in eval mode (local folder only; ``trust_remote_code`` runs the
    model code the checkpoint ships)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=dtype, local_files_only=True,
                                                 trust_remote_code=trust_remote_code)
    return model.eval()


@torch.no_grad()
def target_features(model, input_ids: torch.Tensor, layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the target once.

    Args:
        model: transformers causal LM. input_ids: ``[B, T]``.
        layer_ids: aux layer ids.

    Returns:
        ``(aux [B, T, 3*H], final [B, T, H] post-norm, logits [B, T, V])``.
    """
    out = model(input_ids=input_ids, output_hidden_states=True)
    hs = out.hidden_states  # L + 1 tensors [B, T, H]
    aux = torch.cat([hs[hf_hidden_index(i)] for i in layer_ids], dim=-1)  # [B, T, 3H]
    return aux, hs[-1], out.logits


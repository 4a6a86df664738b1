"""P-EAGLE as a family: EAGLE-3's drafter drafting K tokens from one pass, K - 1 of them from mask slots.

Source: the P-EAGLE parallel-drafting scheme as vLLM 0.32 serves it (``speculative_config.parallel_drafting``;
``v1/spec_decode/llm_base_proposer.py``, ``set_inputs_first_pass`` and the ``copy_and_expand_eagle_inputs``
kernel of ``v1/spec_decode/utils.py``; ``model_executor/models/llama_eagle3.py``), which this module mirrors so that
training matches serving. For a request whose verified tokens end at position ``n - 1`` the drafter runs once over:

- every verified row as in EAGLE-3's first pass: row ``p`` reads token ``x[p+1]`` (the bonus token at the last
  row) with the target's aux features of position ``p`` (``fc`` of them), at position ``p``;
- then K - 1 mask slots at positions ``n, ..., n + K - 2``, each reading the token ``mask_token_id`` (from the
  drafter's ``config.json``; embedded by the target's embedding, which vLLM shares) and the hidden state
  ``combine_hidden_states(mask_hidden)``: the learned ``mask_hidden`` ``[1, n_aux * H_t]`` put through the same
  norms and ``fc`` as real aux features;
- plain causal attention over that one sequence (the mask slots are ordinary query tokens in the drafter's KV
  cache), so slot ``i`` sees the context rows ``0..n-1`` and slots ``1..i``;

and samples the K draft tokens at rows ``n - 1, n, ..., n + K - 2``: slot ``i`` (0 = the last verified row)
proposes ``x[n+i+1]``.

Training reuses the training-time-test unroll of ``drafter/ttt.py`` unchanged: step ``j`` at row ``t`` sits at
position ``t + j`` and attends to the step-0 keys of rows ``0..t`` plus its own row's keys of steps ``1..j``,
which is exactly the attention of mask slot ``j`` after the anchor row ``t``. Only the inputs of steps ``j >= 1``
change: the mask token and ``fc(mask_hidden)`` in place of the chain's previous token and hidden state
(:meth:`PEagleDrafter.step`). Every row of the sequence is an anchor at once, so one unroll of K steps scores all
K parallel positions of every anchor; the target of slot ``j`` at row ``t`` is the target's distribution for
``x[t+j+2]``, with the same loss mask, draft-vocabulary restriction and step weights ``train.loss_decay ** j`` as
EAGLE-3 (``K = train.ttt_steps``). The mask token's embedding stays the target's row, frozen: vLLM shares the
target's embedding with an EAGLE-3 drafter that ships none, so only ``mask_hidden`` is learned for the mask slots.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from draftsmith.drafter.config import DraftConfig
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter, LayerCache
from draftsmith.errors import ModelError
from draftsmith.target.checkpoint import read_target_config

MASK_HIDDEN_INIT_STD = 0.02  # the scale of the drafter's own weight init; training moves it


def mask_token_id(target_path: Path | str) -> int:
    """The token of the mask slots: the target's ``unk_token_id`` (a row chat text does not use), else its last id.

    Only its (frozen) embedding row matters: the slot's learned input is ``mask_hidden``.

    Raises:
        ModelError: no readable ``config.json`` in ``target_path``.
    """
    t = read_target_config(target_path, text=True)
    return int(t["unk_token_id"]) if t.get("unk_token_id") is not None else int(t["vocab_size"]) - 1


class PEagleDrafter(Eagle3Drafter):
    """:class:`Eagle3Drafter` plus ``mask_hidden`` ``[1, n_aux * H_t]`` (the aux-feature input of every mask slot,
    learned) and ``mask_token_id`` (the token of every mask slot). Weights and names are EAGLE-3's plus
    ``mask_hidden``, the name ``llama_eagle3.py`` loads with parallel drafting on."""

    def __init__(self, cfg: DraftConfig, mask_token: int) -> None:
        super().__init__(cfg)
        self.mask_token_id = int(mask_token)
        if not 0 <= self.mask_token_id < cfg.vocab_size:
            raise ModelError(
                f"mask token id {mask_token} is outside the target vocabulary of {cfg.vocab_size}",
                "the target's config names an unk_token_id it does not have",
            )
        g = torch.Generator().manual_seed(0)
        n_in = len(cfg.layer_ids) * cfg.target_hidden_size
        self.mask_hidden = nn.Parameter(torch.randn(1, n_in, generator=g) * MASK_HIDDEN_INIT_STD)

    def mask_inputs(self, B: int, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """What every mask slot reads: token ids ``[B, T]`` (all ``mask_token_id``) and hidden ``[B, T, H]``
        (``fuse(mask_hidden)``, vLLM's ``combine_hidden_states``, broadcast)."""
        ids = torch.full((B, T), self.mask_token_id, dtype=torch.long, device=device)
        hidden = self.fuse(self.mask_hidden)  # [1, H]
        return ids, hidden.view(1, 1, -1).expand(B, T, -1)

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        step: int,
        caches: list[LayerCache],
        position_offset: torch.Tensor | int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft slot ``step`` of every row: step 0 is EAGLE-3's (``input_ids`` ``[B, T]``, ``hidden``
        ``[B, T, H]`` as given); steps >= 1 are mask slots and ignore both (see the module docstring). Returns
        ``(normed [B, T, H], next_hidden [B, T, H])`` as :meth:`Eagle3Drafter.step`."""
        if step >= 1:
            input_ids, hidden = self.mask_inputs(*input_ids.shape, input_ids.device)
        return super().step(input_ids, hidden, step, caches, position_offset)


@torch.no_grad()
def serve_logits(
    model: PEagleDrafter, input_ids: torch.Tensor, aux: torch.Tensor, n: int, k: int
) -> torch.Tensor:
    """The drafter's K draft-vocabulary logit rows for one sequence, computed the way vLLM's parallel drafting
    feeds it (module docstring): one causal pass over ``n`` verified rows and ``k - 1`` mask slots.

    Args:
        input_ids: ``[1, T]`` the sequence, ``T > n``: row ``p < n`` reads ``input_ids[0, p + 1]``.
        aux: ``[1, T, n_aux * H_t]`` the target's aux features. n: verified rows (the last is the anchor).

    Returns:
        ``[k, N]``: slot ``i`` proposes ``x[n + i + 1]``.
    """
    ids = torch.cat(
        [
            input_ids[:, 1 : n + 1],
            torch.full((1, k - 1), model.mask_token_id, dtype=torch.long, device=input_ids.device),
        ],
        dim=1,
    )
    mask_ids, mask_h = model.mask_inputs(1, k - 1, input_ids.device)
    hidden = torch.cat([model.fuse(aux[:, :n]), mask_h], dim=1)  # [1, n + k - 1, H]
    normed, _ = Eagle3Drafter.step(model, ids, hidden, 0, model.new_caches())  # causal, positions 0..n+k-2
    return model.logits(normed[0, n - 1 :])  # [k, N]

"""The target's full-vocabulary top-1 at every position, and whether it is a draft token: computed once per sample.

The TTT loss needs, per position, whether the target's top-1 over its whole vocabulary is a draft token (a top-1
over the draft rows alone would always be one). It costs a ``[T, V]`` matmul per sample, more than a TTT step of a
small drafter, and does not change during a run, so it is cached.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.drafter.ttt import draft_rows, target_view


class TargetTop1:
    """Per-sample cache of ``[T]`` bool "the target's top-1 is a draft token" over one run's fixed ``d2t``.

    Args:
        lm_head: the target's output head (``[V, H]`` weight), on the training device.
        drafter: the drafter whose ``d2t`` / ``t2d`` buffers map the draft vocabulary (read when first needed).
    """

    def __init__(self, lm_head: nn.Module, drafter: nn.Module) -> None:
        self.lm_head, self.drafter = lm_head, drafter
        self._rows: torch.Tensor | None = None
        self._cache: dict[str, torch.Tensor] = {}

    @property
    def rows(self) -> torch.Tensor:
        """``[N, H]`` the target head's rows of the draft vocabulary, gathered once."""
        if self._rows is None:
            self._rows = draft_rows(self.lm_head, self.drafter.d2t)
        return self._rows

    def in_vocab(self, ids: list[str], final: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` bool on the CPU for the samples ``ids`` of a micro-batch, from their final hidden states
        ``final`` ``[B, T, H]`` (``lengths`` ``[B]``: positions past a sample's length are False). Samples not seen
        before are computed here (under the caller's autocast), the rest come from the cache."""
        todo = [i for i, sid in enumerate(ids) if sid not in self._cache]
        if todo:
            view = target_view(final[todo], self.lm_head, self.drafter.d2t, self.drafter.t2d, rows=self.rows)
            for r, i in enumerate(todo):
                self._cache[ids[i]] = view.in_vocab[r, : int(lengths[i])].cpu()
        out = torch.zeros(final.shape[:2], dtype=torch.bool)
        for i, sid in enumerate(ids):
            v = self._cache[sid]
            out[i, : v.numel()] = v
        return out

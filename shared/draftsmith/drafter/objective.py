"""What the trainer optimises: the TTT objective as one module (one DDP/FSDP ``forward`` per micro-batch), the
feature-noise regulariser and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from draftsmith.drafter.model import Eagle3Drafter
from draftsmith.drafter.ttt import StepStats, ttt_loss


class TTTObjective(nn.Module):
    """Wraps the drafter so that DDP sees one ``forward`` per micro-batch (the whole TTT unroll).

    Args:
        k, decay, all_rows, loss: see :func:`~draftsmith.drafter.ttt.ttt_loss`.
        feature_noise: in training mode, Gaussian noise of ``feature_noise`` x (per-token RMS of each aux feature)
            is added to the aux features (a regulariser against the train / held-out gap; off in eval mode).
    """

    def __init__(self, drafter: Eagle3Drafter, k: int, decay: float, all_rows: bool = False,
                 feature_noise: float = 0.0, loss: str = "chunked") -> None:
        super().__init__()
        self.drafter, self.k, self.decay = drafter, k, decay
        self.all_rows, self.feature_noise, self.loss = all_rows, feature_noise, loss

    def forward(self, batch: dict[str, torch.Tensor], view) -> tuple[torch.Tensor, StepStats]:
        aux = batch["aux"]
        if self.training and self.feature_noise > 0:
            aux = add_feature_noise(aux.float(), len(self.drafter.cfg.layer_ids), self.feature_noise)
        return ttt_loss(self.drafter, batch["input_ids"], batch["loss_mask"], aux, batch["lengths"],
                        view, self.k, self.decay, self.all_rows, self.loss)


def add_feature_noise(aux: torch.Tensor, n_aux: int, scale: float) -> torch.Tensor:
    """``aux + scale * rms * N(0, 1)`` per aux feature: ``aux`` ``[B, T, n_aux * H_t]``, ``rms`` ``[B, T, n_aux, 1]``
    is each feature's root-mean-square at that position (so the noise is relative to each layer's own scale)."""
    B, T, D = aux.shape
    x = aux.view(B, T, n_aux, D // n_aux)  # [B, T, n, H_t]
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, n, 1]
    return (x + scale * rms * torch.randn_like(x)).view(B, T, D)


def lr_lambda(total_steps: int, warmup_steps: int, min_ratio: float):
    """Linear warm-up then cosine decay to ``min_ratio`` (SpecForge's schedule)."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))

    return f

"""What the trainer optimises for EAGLE-3: the TTT objective as one module (one DDP/FSDP ``forward`` per
micro-batch) and the feature-noise regulariser."""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.ttt import StepStats, acceptance_step_weights, ttt_loss

# Share of the newest batch in the running per-step accuracies that "acceptance" step weights are computed from.
ACC_EMA = 0.1


class TTTObjective(nn.Module):
    """Wraps the drafter so that DDP sees one ``forward`` per micro-batch (the whole TTT unroll).

    Args:
        k, decay, all_rows, loss: see :func:`~draftsmith.drafter.ttt.ttt_loss`.
        feature_noise: in training mode, Gaussian noise of ``feature_noise`` x (per-token RMS of each aux feature)
            is added to the aux features (a regulariser against the train / held-out gap; off in eval mode).
        step_weights: ``"decay"`` (step ``j`` weighs ``decay ** j``, EAGLE's) or ``"acceptance"``
            (:func:`~draftsmith.drafter.ttt.acceptance_step_weights` of the running per-step training accuracies,
            an exponential average with :data:`ACC_EMA` kept on the device; ``decay ** j`` until the first batch,
            and again after a resume, as the average is not checkpointed).
        hard_row_gamma: in training mode, rows weighted by :func:`~draftsmith.drafter.ttt.hard_row_weights`
            (held-out losses stay unweighted); 0 = off.
    """

    def __init__(self, drafter: Eagle3Drafter, k: int, decay: float, all_rows: bool = False,
                 feature_noise: float = 0.0, loss: str = "chunked", step_weights: str = "decay",
                 hard_row_gamma: float = 0.0) -> None:
        super().__init__()
        self.drafter, self.k, self.decay = drafter, k, decay
        self.all_rows, self.feature_noise, self.loss = all_rows, feature_noise, loss
        if step_weights not in ("decay", "acceptance"):
            raise ValueError(f"step weights {step_weights!r} are not 'decay' or 'acceptance'")
        self.step_weights, self.hard_row_gamma = step_weights, hard_row_gamma
        self.accs: torch.Tensor | None = None  # [k] running training accuracies ("acceptance" only)

    def _weights(self) -> float | torch.Tensor:
        if self.step_weights == "acceptance" and self.accs is not None:
            return acceptance_step_weights(self.accs)
        return self.decay

    def forward(self, batch: dict[str, torch.Tensor], view) -> tuple[torch.Tensor, StepStats]:
        aux = batch["aux"]
        if self.training and self.feature_noise > 0:
            aux = add_feature_noise(aux.float(), len(self.drafter.cfg.layer_ids), self.feature_noise)
        loss, stats = ttt_loss(self.drafter, batch["input_ids"], batch["loss_mask"], aux, batch["lengths"],
                               view, self.k, self._weights(), self.all_rows, self.loss,
                               self.hard_row_gamma if self.training else 0.0)
        if self.training and self.step_weights == "acceptance":
            with torch.no_grad():  # on the device: no host read per step
                acc = (stats.sums[2] / stats.sums[3].clamp(min=1)).float()  # [k]
                self.accs = acc if self.accs is None else (1 - ACC_EMA) * self.accs + ACC_EMA * acc
        return loss, stats


def add_feature_noise(aux: torch.Tensor, n_aux: int, scale: float) -> torch.Tensor:
    """``aux + scale * rms * N(0, 1)`` per aux feature: ``aux`` ``[B, T, n_aux * H_t]``, ``rms`` ``[B, T, n_aux, 1]``
    is each feature's root-mean-square at that position (so the noise is relative to each layer's own scale)."""
    B, T, D = aux.shape
    x = aux.view(B, T, n_aux, D // n_aux)  # [B, T, n, H_t]
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, n, 1]
    return (x + scale * rms * torch.randn_like(x)).view(B, T, D)

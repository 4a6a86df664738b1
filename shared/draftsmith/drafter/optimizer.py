"""The drafter's optimizers: AdamW over every trainable parameter, or Muon over the hidden weight matrices with
AdamW over the rest.

Muon (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024) orthogonalises each 2-D
matrix's momentum update with a Newton-Schulz iteration; it is meant for hidden matrices only, so the embedding, the
output head (``lm_head``, one row per draft-vocabulary token) and every vector (norm weights) stay with AdamW. The
Muon update is rescaled to AdamW's RMS (``adjust_lr_fn="match_rms_adamw"``, Liu et al., "Muon is Scalable for LLM
Training", 2025) so one peak learning rate serves both. The split and its defaults follow speculators' trainer
(``speculators/train/optimizers.py``: Muon lr = lr, momentum 0.95, weight decay 0.1), which trains EAGLE-3 drafters
with it by default; the Muon itself is PyTorch's ``torch.optim.Muon``, its Newton-Schulz iteration run in float32 on
CPUs that emulate bf16 (``newton_schulz.py``).

Each optimizer gets its own ``LambdaLR`` on the same schedule (:class:`LRSchedule`, shaped by :func:`lr_lambda`); both
are stepped and saved as one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from draftsmith.drafter.newton_schulz import float32_newton_schulz
from draftsmith.precision import cpu_has_bf16_kernels

# 2-D weights that are not hidden matrices: an embedding's rows and the output head's rows are per-token vectors
ADAMW_ONLY = ("embed_tokens", "lm_head")


def split_for_muon(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(muon, adamw)``: the trainable hidden weight matrices (2-D, both sides > 1, not in :data:`ADAMW_ONLY`),
    and every other trainable parameter (vectors, the output head). Frozen parameters are in neither."""
    muon: list[nn.Parameter] = []
    adamw: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        hidden = p.ndim == 2 and min(p.shape) > 1 and not any(k in name for k in ADAMW_ONLY)
        (muon if hidden else adamw).append(p)
    return muon, adamw


class Optimizers:
    """One or two optimizers stepped as one (the trainer's ``opt``); iterable, so PyTorch's distributed
    checkpoint API (``get_optimizer_state_dict``/``set_optimizer_state_dict``) saves and restores them together.

    Args:
        model: the drafter (its ``named_parameters``; frozen ones are skipped).
        tc: the train config section: ``optimizer`` (``adamw`` | ``muon``), ``lr``, ``betas``, ``weight_decay``,
            ``muon_lr`` (None = ``lr``), ``muon_momentum``, ``muon_weight_decay``.

    Raises:
        ValueError: the model has no trainable parameter.
    """

    def __init__(self, model: nn.Module, tc: Any) -> None:
        if tc.optimizer == "muon":
            muon, adamw = split_for_muon(model)
        else:
            muon, adamw = [], [p for p in model.parameters() if p.requires_grad]
        if not muon and not adamw:
            raise ValueError("the drafter has no trainable parameter")
        self.optimizers: list[torch.optim.Optimizer] = []
        # torch's Muon orthogonalises in bf16: on a CPU that emulates bf16 that is most of a step (newton_schulz.py)
        self.ns_float32 = bool(muon) and muon[0].device.type == "cpu" and not cpu_has_bf16_kernels()
        if muon:
            self.optimizers.append(torch.optim.Muon(
                muon, lr=tc.muon_lr or tc.lr, momentum=tc.muon_momentum, weight_decay=tc.muon_weight_decay,
                adjust_lr_fn="match_rms_adamw"))
        if adamw:
            self.optimizers.append(torch.optim.AdamW(adamw, lr=tc.lr, betas=tuple(tc.betas),
                                                     weight_decay=tc.weight_decay))

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers)

    def step(self) -> None:
        """One step of every optimizer (Muon's Newton-Schulz in float32 where :attr:`ns_float32`)."""
        for o in self.optimizers:
            with float32_newton_schulz(self.ns_float32 and isinstance(o, torch.optim.Muon)):
                o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every gradient."""
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


class LRSchedule:
    """One ``LambdaLR`` per optimizer of :class:`Optimizers`, all on the same schedule ``lr_lambda`` (step -> share
    of the peak lr), stepped and saved as one (the trainer's ``sched``)."""

    def __init__(self, opts: Optimizers, lr_lambda: Callable[[int], float]) -> None:
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda) for o in opts]

    @property
    def last_epoch(self) -> int:
        """Scheduler steps taken (PyTorch's name: one per optimizer step here)."""
        return self.schedulers[0].last_epoch

    def step(self) -> None:
        """One scheduler step of each."""
        for s in self.schedulers:
            s.step()

    def get_last_lr(self) -> list[float]:
        """The current lr of every parameter group, in optimizer order."""
        return [lr for s in self.schedulers for lr in s.get_last_lr()]

    def state_dict(self) -> dict[str, Any]:
        """Every scheduler's state, in optimizer order (for the checkpoint's ``scheduler.pt``)."""
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a plain ``LambdaLR`` state (one optimizer) goes to every scheduler, as they
        share one schedule.

        Raises:
            ValueError: another number of schedulers (the checkpoint was written with another ``train.optimizer``).
        """
        states = state["schedulers"] if "schedulers" in state else [state] * len(self.schedulers)
        if len(states) != len(self.schedulers):
            raise ValueError(f"the checkpoint has {len(states)} lr schedulers, this train.optimizer has "
                             f"{len(self.schedulers)}")
        for s, st in zip(self.schedulers, states, strict=True):
            s.load_state_dict(st)


def lr_lambda(total_steps: int, warmup_steps: int, min_ratio: float):
    """Linear warm-up then cosine decay to ``min_ratio`` (SpecForge's schedule)."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))

    return f

"""The trainer's fixed-format progress line, what it reports beside the losses (step time, peak memory, MFU), and
the training section of the Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.drafter.ttt import StepStats


def _fmt_s(s: float) -> str:
    """Seconds as H:MM:SS."""
    s = int(max(0, s))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class StepTiming:
    """What the progress line adds beyond the losses: the last gradient norm, seconds per optimizer step, the peak
    memory of the process (GB: ``torch.cuda.max_memory_allocated`` on a GPU, the resident high-water mark on a CPU)
    and the model FLOPs utilisation (None where the device's peak is unknown; :mod:`draftsmith.drafter.flops`)."""

    grad_norm: float | None = None
    step_s: float | None = None
    peak_gb: float | None = None
    mfu: float | None = None


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process so far, in GB: allocated by torch on a GPU, resident (``ru_maxrss``) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


def progress_line(step: int, total: int, epoch: int, st: StepStats, lr: float, tps: float, elapsed: float,
                  timing: StepTiming | None = None) -> str:
    """The fixed-format progress line (one per interval)."""
    eta = elapsed / max(step, 1) * (total - step)
    accs = "/".join(f"{a:.3f}" for a in st.accs)
    t = timing or StepTiming()
    extra = ""
    if t.grad_norm is not None:
        extra += f"grad_norm {t.grad_norm:.3f} "
    if t.step_s is not None:
        extra += f"step_s {t.step_s:.2f} "
    if t.peak_gb is not None:
        extra += f"peak_mem {t.peak_gb:.2f} GB "
    if t.mfu is not None:
        extra += f"mfu {100 * t.mfu:.1f}% "
    return (f"step {step:>7d}/{total} epoch {epoch} loss {sum(st.losses) / max(len(st.losses), 1):.4f} "
            f"acc {accs} accept_len {st.acceptance_length:.3f} lr {lr:.3e} tok/s {tps:,.0f} {extra}"
            f"elapsed {_fmt_s(elapsed)} eta {_fmt_s(eta)}")


def set_train_metrics(run: str, step: int, epoch: int, lr: float, tps: float, train: StepStats,
                      held: StepStats | None) -> None:
    """Set the training gauges of :mod:`draftsmith.metrics` for ``run``: step, epoch, learning rate, tokens/s, and
    per split (``train``, ``heldout`` when given) the loss and accuracy of each TTT step and the acceptance length."""
    from draftsmith import metrics

    metrics.TRAIN_STEP.labels(run).set(step)
    metrics.TRAIN_EPOCH.labels(run).set(epoch)
    metrics.TRAIN_LR.labels(run).set(lr)
    metrics.TRAIN_TOKENS_PER_S.labels(run).set(tps)
    for split, st in (("train", train), ("heldout", held)):
        if st is None:
            continue
        for j, (loss_j, acc_j) in enumerate(zip(st.losses, st.accs, strict=True)):
            metrics.TRAIN_LOSS.labels(run, split, str(j)).set(loss_j)
            metrics.TRAIN_ACC.labels(run, split, str(j)).set(acc_j)
        metrics.TRAIN_ACCEPT_LEN.labels(run, split).set(st.acceptance_length)

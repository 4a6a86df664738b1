"""The run's learning curve: the held-out simulated acceptance of every held-out evaluation, against the samples and
tokens the drafter had trained on by then.

The trainer evaluates on the held-out split every ``train.eval_every`` steps, at the steps that end the fractions
``train.curve_fractions`` of the run when they come before the first of those (log-spaced by default, so a fit
against log(samples seen) has early points too) and at the end; each evaluation is one point. The points travel in each checkpoint's ``state.json``
(``learning_curve``): a resumed run continues the curve of its checkpoint, and a run on an object store carries it
with the checkpoint it pulls. ``draftsmith doctor``'s ``data_size`` check reads it (docs/doctor.md).
"""

from __future__ import annotations

import math
from typing import Any

from draftsmith.drafter.data import make_batches
from draftsmith.drafter.ttt import StepStats


def curve_steps(total_steps: int, fractions: list[float], eval_every: int) -> set[int]:
    """The optimizer steps (1-based) that end each fraction of ``total_steps`` (``ceil(f * total)``, at least 1) and
    come before the first ``eval_every`` evaluation: later ones would sit among those (an evaluation costs as much
    as ``eval_fraction`` of an epoch's forward passes)."""
    return {s for f in fractions if (s := max(1, math.ceil(f * total_steps))) < eval_every}


def seen(lengths: dict[str, int], tc, world: int, epoch: int, position: int) -> tuple[int, int]:
    """``(samples, tokens)`` every rank together has trained on at ``(epoch, position)`` (the trainer's resume
    position: finished epochs, then micro-batches of this epoch per rank), a repeat counting again; ``tc`` is the
    ``train`` settings (batching, seed, accumulation), ``lengths`` the training split's sample lengths.

    Recomputed from the deterministic batch order (:func:`make_batches`), so it needs no counter of its own and
    agrees with a resumed run. Tokens are the samples' own (no padding); samples skipped for NaN features count.
    """
    samples = tokens = 0
    for e in range(epoch + 1):
        batches = make_batches(lengths, tc.batch_tokens, tc.batch_size, tc.seed, e)
        per_rank = len(batches) // world // tc.grad_accum * tc.grad_accum  # what one rank's epoch consumes
        # rank r takes batches[r::world]: the first k of each rank are batches[: k * world]
        done = batches[: (per_rank if e < epoch else position) * world]
        samples += sum(len(b) for b in done)
        tokens += sum(lengths[i] for b in done for i in b)
    return samples, tokens


def curve_point(
    step: int, epoch: int, samples: int, tokens: int, held: StepStats, train: StepStats, eval_s: float
) -> dict[str, Any]:
    """One point: ``step``, ``epoch``, ``samples_seen`` and ``tokens_seen`` (:func:`seen`), ``heldout`` (per TTT step
    ``acc`` and the simulated ``accept_len``), ``train`` (the same for the last logged interval of the training split,
    None before the first) and ``eval_s`` (seconds the held-out pass took: the cost of the point)."""

    def figures(st: StepStats) -> dict[str, Any] | None:
        return (
            None
            if st.empty
            else {"acc": [round(a, 5) for a in st.accs], "accept_len": round(st.acceptance_length, 5)}
        )

    return {
        "step": step,
        "epoch": epoch,
        "samples_seen": samples,
        "tokens_seen": tokens,
        "heldout": figures(held),
        "train": figures(train),
        "eval_s": round(eval_s, 3),
    }


def add_point(curve: list[dict[str, Any]], point: dict[str, Any]) -> None:
    """Append ``point``; a second evaluation at the same step (the closing one) replaces the first."""
    if curve and curve[-1]["step"] == point["step"]:
        curve[-1] = point
    else:
        curve.append(point)

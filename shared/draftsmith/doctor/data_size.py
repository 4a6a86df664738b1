"""Check: too little data, read from the run's own learning curve (docs/doctor.md, "data_size").

The trainer keeps, at each held-out evaluation, the held-out simulated acceptance length against the samples it had
trained on by then (:mod:`draftsmith.drafter.curve`, in the checkpoint's ``state.json``). Its tail (the points within
the last two doublings of the samples seen) is fitted as acceptance length against log2(samples seen)
(:func:`scipy.stats.linregress`): the slope is the gain per doubling of data. A slope that is still clearly positive
at the end means more data would still buy acceptance; a training split that accepts far more than the held-out one
means the drafter memorises its samples, which more data cures and more epochs do not. Either is a finding, with the
samples the fit asks for a stated gain. Within one run the samples seen grow with the steps, so on a run of several
epochs "still rising" can also mean "stopped early": the evidence gives the epochs.
"""

from __future__ import annotations

import math
from typing import Any

from draftsmith.doctor.finding import CheckResult, Finding, skipped
from draftsmith.doctor.run import RunView

CHECK = "data_size"
MIN_POINTS = 3  # a line through fewer says nothing about its own error
MIN_GAIN = 0.05  # acceptance length per doubling of samples seen; below it the curve is flat for this check
MEMORISE_GAP = (
    0.3  # training-split minus held-out acceptance length at the end; docs/benchmarks.md saw 0.8 on 647
)
#                     prompts and 0.04 on 1,717 of the same kind
TARGET_GAIN = 0.1  # the fix names the samples that buy this much held-out acceptance length
MAX_COST = (
    0.5  # estimate: what one more doubling buys, as a share of the current acceptance length, at most this
)


def fit(points: list[dict[str, Any]]) -> tuple[float, float, list[dict[str, Any]]]:
    """``(slope, stderr, tail)``: held-out acceptance length against log2(samples seen) over the curve's tail (the
    points with at least a quarter of the last point's samples; the last :data:`MIN_POINTS` when fewer)."""
    from scipy.stats import linregress

    tail = [p for p in points if p["samples_seen"] >= points[-1]["samples_seen"] / 4]
    tail = tail if len(tail) >= MIN_POINTS else points[-MIN_POINTS:]
    r = linregress([math.log2(p["samples_seen"]) for p in tail], [p["heldout"]["accept_len"] for p in tail])
    return float(r.slope), float(r.stderr), tail


def _train_samples(run: RunView) -> int | None:
    """The run's training samples (its data less the held-out split of ``train.eval_fraction``), None without data."""
    from draftsmith.drafter.data import held_out

    if not run.data_manifest:
        return None
    frac = float(((run.settings or {}).get("train") or {}).get("eval_fraction", 0.05))
    return (
        sum(not held_out(sid, frac) for e in run.data_manifest["shards"] for sid in e["sample_ids"]) or None
    )


def check(run: RunView) -> CheckResult:
    """The learning curve's slope at its end and the train/held-out gap; a finding when either says more data."""
    curve = (run.state or {}).get("learning_curve")
    if curve is None:
        return skipped(
            CHECK,
            "no learning curve recorded (a checkpoint of a draftsmith that kept none, or no "
            "checkpoint): retrain to record one (`draftsmith train`, train.resume=false)",
        )
    points = [p for p in curve if p.get("heldout") and p.get("samples_seen", 0) > 0]
    if len({p["samples_seen"] for p in points}) < MIN_POINTS:
        return skipped(
            CHECK,
            f"the learning curve has {len(points)} held-out point(s), needs {MIN_POINTS} at "
            "distinct sample counts: train longer, or with more train.curve_fractions (held-out "
            "split needed: train.eval_fraction > 0)",
        )
    slope, stderr, tail = fit(points)
    last = points[-1]
    held = last["heldout"]["accept_len"]
    train = (last.get("train") or {}).get("accept_len")
    rising = slope >= MIN_GAIN and slope - 2 * stderr > 0
    memorises = train is not None and train - held >= MEMORISE_GAP
    if not (rising or memorises):
        return CheckResult(
            CHECK,
            True,
            note=f"flat: {slope:+.3f} +- {stderr:.3f} accept_len per doubling of the "
            f"samples seen over the last {len(tail)} points",
        )
    return CheckResult(CHECK, True, [_finding(run, points, tail, slope, stderr, rising, memorises)])


def _finding(
    run: RunView, points, tail, slope: float, stderr: float, rising: bool, memorises: bool
) -> Finding:
    """The finding: still rising after a full pass (more data), still rising before one (more training first), or
    memorising; the evidence is the curve, the fit and the two splits."""
    n, last = _train_samples(run), points[-1]
    held, train = last["heldout"]["accept_len"], (last.get("train") or {}).get("accept_len")
    passes = last["samples_seen"] / n if n else None
    evidence = (
        "held-out accept_len by samples seen "
        + ", ".join(f"{p['samples_seen']:,}: {p['heldout']['accept_len']:.3f}" for p in points)
        + f"; fit over the last {len(tail)} points: {slope:+.3f} +- {stderr:.3f} per doubling"
        + ("" if n is None else f"; {passes:.2f} passes over {n:,} training samples")
        + ("" if train is None else f"; training split {train:.3f} against held-out {held:.3f}")
    )
    causes = []
    if rising:
        causes.append(
            f"held-out acceptance length still rises {slope:.2f} per doubling of the samples trained on"
        )
    if memorises:
        causes.append(
            f"the training split accepts {train - held:.2f} more than the held-out one (the drafter "
            "memorises its samples)"
        )
    cost = min(MAX_COST, max(slope if rising else 0.0, 0.5 * (train - held) if memorises else 0.0) / held)
    if rising and passes is not None and passes < 1 and not memorises:
        # the run has not used the data it has: more of it would not be read either
        return Finding(
            CHECK,
            "too little training: " + "; ".join(causes) + f", after {passes:.0%} of one pass over the data",
            cost,
            evidence,
            "train on all of the data (train.epochs >= 1, no "
            "train.max_steps below one epoch), then run doctor again",
        )
    if rising:
        factor = 2 ** (TARGET_GAIN / slope)
        more = (f"about {math.ceil(n * (factor - 1)):,} more samples" if n else "more samples") + (
            f" (x{factor:.1f} the data) for +{TARGET_GAIN} accept_len"
        )
    else:
        more = (
            "more samples (the held-out curve is flat, so it cannot say how many; doubling is the usual step)"
        )
    fix = (
        f"{more}: `draftsmith enqueue --run {run.root.name} --source PROMPTS --limit N` (prompts like the "
        "training ones), generate, then `draftsmith build-data`, `extract` and `train` with train.resume=false"
    )
    return Finding(CHECK, "too little data: " + "; ".join(causes), cost, evidence, fix)

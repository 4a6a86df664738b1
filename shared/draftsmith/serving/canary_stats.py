"""The canary's decision rule: a paired bootstrap interval of candidate / current mean acceptance length.

Each replayed request gives one pair (the current drafter's acceptance length on it, the candidate's), both from the
engines' own ``vllm:spec_decode_*`` counters (1 + accepted / drafts of that request, bonus token counted,
``docs/evaluation.md``). Resampling the pairs together (``scipy.stats.bootstrap(paired=True)``, BCa) keeps what the
two drafters share (a prompt easy for both) out of the interval's width. Promote when the interval's low end is above
``canary.threshold`` (1.0: better with the chosen confidence); roll back otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftsmith.errors import DataError

PROMOTE, ROLLBACK = "promote", "rollback"


@dataclass(frozen=True)
class RatioInterval:
    """candidate / current mean acceptance length over the same requests, with its bootstrap interval."""

    ratio: float
    low: float
    high: float
    confidence: float
    pairs: int
    current_mean: float
    candidate_mean: float


def _ratio_of_means(current: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(candidate, axis=axis) / np.mean(current, axis=axis)


def paired_ratio_interval(current: list[float], candidate: list[float], confidence: float = 0.9,
                          resamples: int = 2000, seed: int = 0) -> RatioInterval:
    """The ratio of the candidate's mean acceptance length to the current one's, with a paired bootstrap interval.

    Args:
        current: per-request mean acceptance length of the current drafter (1..K+1), one per replayed request.
        candidate: the candidate's on the same requests, in the same order.
        confidence: confidence level of the two-sided interval (0..1).
        resamples: bootstrap resamples.
        seed: the resampling's random seed (the same numbers give the same interval).

    Returns:
        :class:`RatioInterval`. When every pair is identical the interval is the ratio itself (nothing varies).

    Raises:
        DataError: fewer than two pairs, or lists of different lengths.
    """
    from scipy.stats import bootstrap

    if len(current) != len(candidate):
        raise DataError(f"{len(current)} current and {len(candidate)} candidate measurements: they must pair up",
                        "replay the same requests to both engines")
    if len(current) < 2:
        raise DataError(f"{len(current)} paired request(s) measured: an interval needs two or more",
                        "raise canary.min_requests or replay prompts with longer answers (canary.max_tokens)")
    cur, cand = np.asarray(current, dtype=float), np.asarray(candidate, dtype=float)
    ratio = float(_ratio_of_means(cur, cand))
    low = high = ratio
    if np.ptp(cur) > 0 or np.ptp(cand) > 0:
        res = bootstrap((cur, cand), _ratio_of_means, paired=True, vectorized=True, confidence_level=confidence,
                        n_resamples=resamples, method="BCa", rng=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if not (np.isfinite(low) and np.isfinite(high)):  # BCa degenerates on near-constant data
            res = bootstrap((cur, cand), _ratio_of_means, paired=True, vectorized=True, confidence_level=confidence,
                            n_resamples=resamples, method="percentile", rng=np.random.default_rng(seed))
            low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return RatioInterval(ratio, low, high, confidence, len(cur), float(cur.mean()), float(cand.mean()))


def decide(interval: RatioInterval, threshold: float) -> str:
    """:data:`PROMOTE` when the interval's low end is above ``threshold``, else :data:`ROLLBACK`."""
    return PROMOTE if interval.low > threshold else ROLLBACK

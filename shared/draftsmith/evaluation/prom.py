"""Prometheus text exposition, read with ``prometheus_client``'s own parser.

An engine's ``/metrics`` is a snapshot of monotonically growing counters; the evaluator takes one before and one
after a set and works on the difference, so numbers left by earlier traffic (the dev server's warm-up, another
user) never leak into a report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from draftsmith.errors import EngineError


@dataclass(frozen=True)
class Sample:
    """One sample line: full sample name (``..._total`` for counters), its labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_text(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (HELP/TYPE lines and ``_created`` samples dropped).

    Raises:
        EngineError: the text is not valid Prometheus exposition.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                out.append(Sample(s.name, dict(s.labels), float(s.value)))
    except (ValueError, TypeError) as e:
        raise EngineError(f"the engine's /metrics text is not valid Prometheus exposition ({e})") from e
    return out


def total(samples: Iterable[Sample], name: str, model: str | None = None, **labels: str) -> float | None:
    """Sum of the samples named ``name`` whose labels match ``labels`` (and ``model_name`` if given).

    Summing adds up the per-engine series of a data-parallel server. Returns None when no sample matches, so a
    missing metric is not mistaken for a zero.
    """
    found = False
    acc = 0.0
    for s in samples:
        if s.name != name:
            continue
        if model is not None and s.labels.get("model_name", model) != model:
            continue
        if any(s.labels.get(k) != v for k, v in labels.items()):
            continue
        found = True
        acc += s.value
    return acc if found else None


def by_label(samples: Iterable[Sample], name: str, label: str, model: str | None = None) -> dict[str, float]:
    """Sum of the samples named ``name`` grouped by the value of ``label`` (e.g. ``position``)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name != name or label not in s.labels:
            continue
        if model is not None and s.labels.get("model_name", model) != model:
            continue
        out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def fetch(url: str, timeout_s: float = 10.0) -> str:
    """``GET {url}/metrics`` as text.

    Raises:
        EngineError: the engine does not answer or has no metrics endpoint (SGLang needs ``--enable-metrics``).
    """
    try:
        r = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise EngineError(
            f"cannot read {url.rstrip('/')}/metrics ({type(e).__name__}: {e})",
            "check the engine is up; SGLang needs --enable-metrics",
        ) from e
    return r.text

"""When the refresh loop makes a new drafter version: enough captured traffic since the serving version's data was
built, or the stable engine's acceptance on live traffic below a floor (``docs/serving.md``, "Refresh").

The traffic count reads the run's record shards (``source: "traffic"`` records with ``captured_at`` after the
serving version's ``records_cutoff``, else its ``created`` time); the live acceptance reads the stable engine's own
``vllm:spec_decode_*`` counters, as the canary does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftsmith.artifacts import records as artifact
from draftsmith.config_serving import RefreshConfig
from draftsmith.evaluation.vllm_metrics import SpecCounters

TRAFFIC = "traffic"  # the ``source`` of a captured record (serving/capture.py)


@dataclass(frozen=True)
class TrafficCount:
    """Captured records after a cutoff: ``answered`` (``status: ok``, trainable as they are) and ``unanswered``
    (the prompt alone, ``error.reason: unanswered``)."""

    answered: int = 0
    unanswered: int = 0


@dataclass(frozen=True)
class Trigger:
    """One check's outcome: whether to refresh, why (``traffic``, ``acceptance`` or ``""``) and the figures it was
    decided on (``acceptance``: mean acceptance length on live traffic, None when not read or too few drafts)."""

    refresh: bool
    reason: str
    traffic: TrafficCount
    acceptance: float | None

    def line(self) -> str:
        """One human line: the decision and its figures."""
        acc = "-" if self.acceptance is None else f"{self.acceptance:.3f}"
        what = f"refresh ({self.reason})" if self.refresh else "no refresh"
        return (f"{what}: {self.traffic.answered} new answered traffic records ({self.traffic.unanswered} "
                f"unanswered), live acceptance length {acc}")


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def data_cutoff(provenance: dict[str, Any]) -> float:
    """Unix time up to which a version's data took captured records: ``records_cutoff`` (a refresh records it),
    else the version's ``created`` time (a version made before serving took no traffic after it), else 0."""
    return float(provenance.get("records_cutoff") or provenance.get("created") or 0.0)


def count_traffic(records_dir: Path, since: float) -> TrafficCount:
    """Captured records of the run whose ``captured_at`` is after ``since`` (Unix seconds; whole seconds, as
    capture writes them, so a record of the cutoff's own second counts as new).

    Lines that are not JSON objects are left to build-data to report; no records folder counts as none.
    """
    answered = unanswered = 0
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        return TrafficCount()
    for path in artifact.shard_files(records_dir):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or rec.get("source") != TRAFFIC:
                    continue
                at = _timestamp(rec.get("captured_at"))
                if at is None or at + 1 <= since:
                    continue
                if rec.get("status") == "ok":
                    answered += 1
                else:
                    unanswered += 1
    return TrafficCount(answered, unanswered)


def live_acceptance(delta: SpecCounters, min_drafts: int) -> float | None:
    """Mean acceptance length (1 + accepted / drafts, bonus token counted) of a counter difference, None with
    fewer than ``min_drafts`` verify steps (too little traffic to judge)."""
    if not delta.has_spec or delta.drafts < min_drafts:
        return None
    return 1.0 + delta.accepted / delta.drafts


def decide_refresh(cfg: RefreshConfig, traffic: TrafficCount, acceptance: float | None) -> Trigger:
    """Refresh when ``traffic.answered >= cfg.min_new_records``, or when ``acceptance`` is below
    ``cfg.acceptance_floor`` and at least one new answered record exists (a refresh with no new data would train on
    what the serving version already saw)."""
    if traffic.answered >= cfg.min_new_records:
        return Trigger(True, "traffic", traffic, acceptance)
    floor = cfg.acceptance_floor
    if floor is not None and acceptance is not None and acceptance < floor and traffic.answered > 0:
        return Trigger(True, "acceptance", traffic, acceptance)
    return Trigger(False, "", traffic, acceptance)

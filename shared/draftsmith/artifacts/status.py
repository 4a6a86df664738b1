"""Stage status snapshots under ``runs/<run>/status/<stage>.json`` (docs/formats.md owners table): the one shape
every stage writes and ``draftsmith status`` prints, its writer and reader.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.storage import atomic_write_text

STATUS_DIR = "status"


def snapshot_path(run_root: Path, stage: str) -> Path:
    """``runs/<run>/status/<stage>.json`` (a local path, or an object of a run on a store)."""
    return run_location(run_root) / STATUS_DIR / f"{stage}.json"


PHASES = ("running", "done", "failed", "skipped")


def stage_snapshot(stage: str, phase: str, line: str, **numbers: object) -> dict:
    """The one snapshot shape every stage writes to ``runs/<run>/status/<stage>.json``.

    Args:
        stage: the stage's name (``data``, ``extract``, ``train``, ...).
        phase: one of :data:`PHASES`.
        line: the human progress line ``status`` prints as is.
        numbers: the stage's own figures, kept for tools, dashboards and tests (``status`` never reads them).

    Returns:
        ``{"stage", "phase", "line", "updated_at" (epoch seconds, float), **numbers}``.

    Raises:
        ValueError: an unknown phase.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown stage phase {phase!r} (one of {', '.join(PHASES)})")
    return {"stage": stage, "phase": phase, "line": line, "updated_at": time.time(), **numbers}


def write_snapshot(run_root: Path, stage: str, phase: str, line: str, **numbers: object) -> dict:
    """Write a stage's status snapshot (:func:`stage_snapshot`, atomically) and return it."""
    snap = stage_snapshot(stage, phase, line, **numbers)
    atomic_write_text(snapshot_path(run_root, stage), json.dumps(snap, indent=1, default=str))
    return snap


def read_snapshots(run_root: Path) -> list[dict]:
    """Every stage snapshot of a run, least recently updated first (unreadable files are left out)."""
    out = []
    for p in sorted((run_location(run_root) / STATUS_DIR).glob("*.json")):
        try:
            snap = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(snap, dict):
            continue
        snap.setdefault("stage", p.stem)
        snap["updated_at"] = float(snap["updated_at"]) if isinstance(snap.get("updated_at"), (int, float)) else 0.0
        out.append(snap)
    return sorted(out, key=lambda d: d["updated_at"])


def snapshot_phase(snap: dict) -> str:
    """The snapshot's ``phase`` (``running`` for a snapshot written without one)."""
    return str(snap.get("phase") or "running")


def snapshot_line(snap: dict) -> str:
    """The snapshot's human ``line``, as the stage wrote it."""
    return str(snap.get("line") or "(no progress line yet)")

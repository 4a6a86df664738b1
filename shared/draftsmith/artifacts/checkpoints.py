"""Training checkpoints under ``runs/<run>/checkpoints/`` (docs/formats.md §5): names, schema tag, pointer.

Layout: ``step-XXXXXXXX/`` folders holding ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng.pt``
and ``state.json`` (schema :data:`STATE_SCHEMA`; a folder is complete when it has one), and ``latest.json``
(``{"checkpoint": "<folder name>", "step": n}``) naming the newest. Writer and reader:
:mod:`draftsmith.drafter.checkpoint`.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.artifacts.location import run_location

STATE_SCHEMA = "draftsmith.checkpoint/1"
LATEST_FILE = "latest.json"
STATE_FILE = "state.json"
WEIGHTS_FILE = "model.safetensors"
# the trainer's resume state beside the weights (draftsmith.drafter.checkpoint)
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
FOLDER_GLOB = "step-*"


def folder_name(step: int) -> str:
    """Checkpoint folder name of ``step``: ``step-XXXXXXXX``."""
    return f"step-{step:08d}"


def latest_path(checkpoints_dir: Path) -> Path:
    """``checkpoints/latest.json``."""
    return run_location(checkpoints_dir) / LATEST_FILE


def write_latest(checkpoints_dir: Path, name: str, step: int) -> None:
    """Point ``latest.json`` at checkpoint folder ``name`` (atomic replace)."""
    from draftsmith.artifacts.storage import atomic_write_text

    atomic_write_text(latest_path(checkpoints_dir), json.dumps({"checkpoint": name, "step": step}))


def read_latest(checkpoints_dir: Path) -> str | None:
    """The folder name ``latest.json`` points at, None when there is no pointer.

    Raises:
        ValueError / KeyError: the pointer is not JSON or has no ``checkpoint``.
    """
    f = latest_path(checkpoints_dir)
    return str(json.loads(f.read_text())["checkpoint"]) if f.is_file() else None

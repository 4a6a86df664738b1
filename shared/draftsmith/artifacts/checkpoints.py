"""Training checkpoints under ``runs/<run>/checkpoints/`` (docs/formats.md §5): names, schema tag, pointer, and the
:class:`CheckpointStore` interface every stage goes through.

Layout: ``step-XXXXXXXX/`` folders holding ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng.pt``
and ``state.json`` (schema :data:`STATE_SCHEMA`; a folder is complete when it has one), and ``latest.json``
(``{"checkpoint": "<folder name>", "step": n}``) naming the newest. The store places the folder, its ``state.json``
and the pointer (:mod:`draftsmith.artifacts.local_checkpoints`, :mod:`draftsmith.artifacts.object_checkpoints`,
picked once by :func:`draftsmith.artifacts.checkpoint_store.checkpoint_store`); the tensors in it are written and
read by :mod:`draftsmith.drafter.checkpoint`.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.artifacts.provenance import stamp
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import ModelError

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
    return Path(checkpoints_dir) / LATEST_FILE


def write_latest(checkpoints_dir: Path, name: str, step: int) -> None:
    """Point ``latest.json`` at checkpoint folder ``name`` (atomic replace)."""
    atomic_write_text(latest_path(checkpoints_dir), latest_document(name, step))


def latest_document(name: str, step: int) -> str:
    """The text of ``latest.json`` naming checkpoint folder ``name`` of ``step``."""
    return json.dumps({"checkpoint": name, "step": step})


def read_latest(checkpoints_dir: Path) -> str | None:
    """The folder name ``latest.json`` points at, None when there is no pointer.

    Raises:
        ValueError / KeyError: the pointer is not JSON or has no ``checkpoint``.
    """
    f = latest_path(checkpoints_dir)
    return str(json.loads(f.read_text())["checkpoint"]) if f.is_file() else None


def state_document(state: dict[str, Any]) -> str:
    """The text of a checkpoint's ``state.json``: ``state`` (step, epoch, position, config, ...) with the schema, the
    provenance stamp (:func:`draftsmith.artifacts.provenance.stamp`) and the write time (``saved_at`` UTC,
    ``saved_ns`` nanoseconds since the epoch: what orders checkpoints by write time)."""
    return json.dumps({"schema": STATE_SCHEMA, **stamp(state),
                       "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "saved_ns": time.time_ns()}, indent=2)


def read_state(ckpt: Path) -> dict[str, Any]:
    """``state.json`` of a checkpoint folder.

    Raises:
        ModelError: missing, unreadable or of another schema (a corrupt or foreign checkpoint).
    """
    try:
        state = json.loads((Path(ckpt) / STATE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"checkpoint {ckpt} has no readable state.json ({e})", "pick another checkpoint") from e
    if state.get("schema") != STATE_SCHEMA:
        raise ModelError(f"checkpoint {ckpt} has schema {state.get('schema')!r}", "it was written by another tool")
    return state


class CheckpointStore(ABC):
    """A run's training checkpoints: where the trainer saves, resumes and rotates them and where export finds them.

    Every checkpoint is handed out as a local folder (:attr:`folder` ``/ step-XXXXXXXX``), so torch and safetensors
    read and write plain files; a store on an object store keeps that folder as its working copy and moves whole
    checkpoints between it and the store. Implementations: :class:`~draftsmith.artifacts.local_checkpoints.
    LocalCheckpointStore`, :class:`~draftsmith.artifacts.object_checkpoints.ObjectCheckpointStore`.

    Guarantees: a crash mid-save leaves the last complete checkpoint as the latest; a folder counts only once its
    ``state.json`` is there (written after the files it describes).
    """

    folder: Path  # the local checkpoints folder (the run's own, or the working copy's)

    @abstractmethod
    def save(self, write: Callable[[Path], None], state: dict[str, Any], keep: int) -> Path:
        """Write the checkpoint of ``state["step"]``: ``write(folder)`` puts the tensors' files into an empty
        folder, then the store adds ``state.json`` (:func:`state_document`), makes it the latest and keeps the
        newest ``keep`` (0: all). Returns the local checkpoint folder.

        Raises:
            OSError: the local write failed (a full disk); the previous checkpoints stay.
            StorageError: the object store failed, or another trainer saved the same step meanwhile.
        """

    @abstractmethod
    def list(self) -> list[Path]:
        """Complete local checkpoints, oldest WRITTEN first."""

    @abstractmethod
    def latest(self) -> Path | None:
        """The latest complete checkpoint (what a resume continues from), None when there is none."""

    @abstractmethod
    def resolve(self, name: str | None) -> Path:
        """A checkpoint from a folder name (``step-00000100``), a local path, or None for the latest.

        Raises:
            ModelError: nothing found (the message lists what there is).
        """

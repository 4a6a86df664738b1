"""Checkpoints in a local folder: each written under a hidden temporary name and renamed, then ``latest.json``
replaced atomically, then the oldest beyond ``keep`` removed (docs/formats.md §5). A crash at any point leaves
the previous checkpoint complete and named by ``latest.json``; a half-written folder stays hidden (``.tmp-...``) and
is replaced by the next save of its step.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.artifacts.checkpoints import (
    FOLDER_GLOB,
    STATE_FILE,
    CheckpointStore,
    folder_name,
    read_latest,
    state_document,
    write_latest,
)
from draftsmith.errors import ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)


def written_at(ckpt: Path) -> tuple[int, str]:
    """Sort key of a checkpoint by write time: ``saved_ns`` of its state.json (older checkpoints: the file's
    mtime in ns), then its name."""
    f = ckpt / STATE_FILE
    try:
        ns = json.loads(f.read_text()).get("saved_ns")
        return (int(ns) if ns is not None else f.stat().st_mtime_ns, ckpt.name)
    except (OSError, ValueError, TypeError):
        return (0, ckpt.name)


class LocalCheckpointStore(CheckpointStore):
    """The checkpoints of a run on a local disk (or a shared file system), in ``folder`` (``runs/<run>/checkpoints``).

    Args:
        folder: the checkpoints folder; created on the first save.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def save(self, write: Callable[[Path], None], state: dict[str, Any], keep: int) -> Path:
        """See :meth:`CheckpointStore.save`; the folder appears whole (rename) or not at all."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = folder_name(state["step"])
        final, tmp = self.folder / name, self.folder / f".tmp-{name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write(tmp)
        (tmp / STATE_FILE).write_text(state_document(state))
        if final.exists():  # `train --no-resume` in a run that has this step: the new training replaces it
            shutil.rmtree(final)
        tmp.rename(final)
        write_latest(self.folder, name, state["step"])
        kept = self.prune(keep)
        log.info("checkpoint %s written (%d kept)", final, len(kept))
        return final

    def prune(self, keep: int) -> list[Path]:
        """Remove the complete checkpoints older (by write time) than the newest ``keep`` (0: keep all); returns
        those kept."""
        ckpts = self.list()
        if keep <= 0:
            return ckpts
        for old in ckpts[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return ckpts[-keep:]

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest WRITTEN first (not by name: ``train --no-resume`` in a run with checkpoints
        writes ``step-00000001`` after ``step-00000004``, and rotation must keep the new one)."""
        if not self.folder.is_dir():
            return []
        return sorted((p for p in self.folder.glob(FOLDER_GLOB) if (p / STATE_FILE).is_file()), key=written_at)

    def latest(self) -> Path | None:
        """The checkpoint ``latest.json`` names (or the newest complete one), None when there is none."""
        name = read_latest(self.folder) if self.folder.is_dir() else None
        if name is not None and (self.folder / name / STATE_FILE).is_file():
            return self.folder / name
        ckpts = self.list()
        return ckpts[-1] if ckpts else None

    def resolve(self, name: str | None) -> Path:
        """See :meth:`CheckpointStore.resolve`.

        Raises:
            ModelError: no complete checkpoint by that name, or none at all.
        """
        if name:
            p = Path(name)
            cand = p if p.is_dir() else self.folder / name
            if not (cand / STATE_FILE).is_file():
                raise ModelError(f"no checkpoint at {cand}", f"pick one of {[c.name for c in self.list()]}")
            return cand
        found = self.latest()
        if found is None:
            raise ModelError(f"no checkpoint under {self.folder}", "train first: `draftsmith train --run RUN`")
        return found

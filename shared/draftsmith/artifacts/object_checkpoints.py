"""Checkpoints of a run on an object store: written and read in this host's working copy, each saved one sent
to the store at once, so another host resumes or exports from the store.

A save first completes the local checkpoint (:class:`~draftsmith.artifacts.local_checkpoints.LocalCheckpointStore`:
a crash leaves the previous one), then sends its files, then its ``state.json`` with put-if-absent (a folder counts
as complete once its ``state.json`` is there, so a host lost mid-upload leaves an incomplete folder that no reader
takes), then replaces ``latest.json`` (one PUT), then removes the store's checkpoints beyond ``keep``. The store's
``latest.json`` therefore always names a complete checkpoint.

A reader pulls only what it needs: the checkpoint the store's ``latest.json`` names (a resume, an export) or the one
asked for by name, into a hidden folder renamed when whole. One trainer writes a run: a ``state.json`` that appears on
the store after this trainer started, from another writer, stops the save with a clear error instead of mixing two
trainings' files in one folder; one from before (``train --no-resume`` over an old run) is replaced, as on a local disk.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts.checkpoints import LATEST_FILE, STATE_FILE, latest_document, write_latest
from draftsmith.artifacts.local_checkpoints import LocalCheckpointStore
from draftsmith.artifacts.location import (
    describe_store_error,
    list_names,
    put_if_absent,
    read_bytes,
    write_bytes,
)
from draftsmith.errors import StorageError
from draftsmith.log import get_logger

if TYPE_CHECKING:
    from upath import UPath

log = get_logger(__name__)

CHECKPOINTS = "checkpoints"


class ObjectCheckpointStore(LocalCheckpointStore):
    """The checkpoints of the run at ``root`` (an object-store URL), through the local folder ``folder``: this
    host's working copy, ``<local_root>/checkpoints`` (:func:`draftsmith.artifacts.location.local_root`, the same copy
    the other stages use; :func:`draftsmith.artifacts.checkpoint_store.checkpoint_store` picks it).

    Args:
        root: the run (``s3://bucket/runs/<run>``).
        folder: the working copy's checkpoints folder.
    """

    def __init__(self, root: UPath, folder: Path) -> None:
        super().__init__(folder)
        self.remote = root / CHECKPOINTS
        self.since_ns = time.time_ns()  # a checkpoint saved on the store after this is another writer's
        self.saved: set[str] = set()  # what this store sent

    def save(self, write: Callable[[Path], None], state: dict[str, Any], keep: int) -> Path:
        """See :meth:`CheckpointStore.save`: the local checkpoint first, then the store's (module docstring).

        Raises:
            StorageError: the store failed (the local checkpoint is kept; the store's latest stays the previous
                one), or another trainer saved this step of the run on the store while this one ran.
        """
        final = super().save(write, state, keep)
        self._send(final)
        write_bytes(self.remote / LATEST_FILE, latest_document(final.name, state["step"]).encode())
        if keep > 0 and (gone := self._prune_store(keep)):
            log.info("removed %s from %s (train.keep = %d)", ", ".join(gone), self.remote, keep)
        return final

    def _saved_ns(self, name: str) -> int | None:
        """``saved_ns`` of the store's ``<name>/state.json``, None when it has none (0 when it has no time)."""
        try:
            return int(json.loads(read_bytes(self.remote / name / STATE_FILE)).get("saved_ns") or 0)
        except FileNotFoundError:
            return None

    def _another_writer(self, name: str, when: int) -> StorageError:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when / 1e9))
        return StorageError(f"another trainer saved checkpoint {name} of {self.remote} at {at}, while this one was "
                            "training", "train a run with one trainer at a time: stop the other, "
                            "or train into another run name")

    def _send(self, ckpt: Path) -> None:
        """Send the local checkpoint ``ckpt`` to the store: its files, then its ``state.json`` with put-if-absent."""
        name, fs, base = ckpt.name, self.remote.fs, f"{self.remote.path}/{ckpt.name}"
        there = self._saved_ns(name)
        if there is not None:
            if there >= self.since_ns and name not in self.saved:
                raise self._another_writer(name, there)
            self._remove(name)  # an older training's, or this one's saved again: replaced, as on a local disk
        try:
            for f in sorted(ckpt.iterdir()):
                if f.name != STATE_FILE:
                    fs.put_file(str(f), f"{base}/{f.name}")
        except Exception as e:  # the client's own error types differ per store and version
            raise describe_store_error(self.remote / name, e) from e
        if not put_if_absent(self.remote / name / STATE_FILE, (ckpt / STATE_FILE).read_bytes()):
            raise self._another_writer(name, self._saved_ns(name) or 0)
        self.saved.add(name)

    def _remove(self, name: str) -> None:
        try:
            self.remote.fs.rm(f"{self.remote.path}/{name}", recursive=True)
        except FileNotFoundError:
            pass
        except Exception as e:
            raise describe_store_error(self.remote / name, e) from e

    def _prune_store(self, keep: int) -> list[str]:
        """Remove from the store the complete checkpoints older (by write time) than its newest ``keep``, and the
        incomplete folders named before the oldest kept (uploads that never finished); returns the names removed."""
        names = [n for n in list_names(self.remote, "") if n.startswith("step-")]
        written = {n: ns for n in names if (ns := self._saved_ns(n)) is not None}
        if len(written) <= keep:
            return []
        order = sorted(written, key=lambda n: (written[n], n))
        kept = set(order[-keep:])
        gone = [n for n in names if n not in kept and (n in written or n < min(kept))]
        for n in gone:
            self._remove(n)
        return gone

    def _pull(self, name: str) -> int:
        """Copy the store's checkpoint ``name`` into the working copy (a hidden folder renamed when whole); returns
        the files copied, 0 when the store has no complete checkpoint of that name."""
        if self._saved_ns(name) is None:
            return 0
        fs, base = self.remote.fs, f"{self.remote.path}/{name}"
        tmp = self.folder / f".pull-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            files = fs.find(base, detail=False, withdirs=False)
            for path in files:
                fs.get_file(path, str(tmp / str(path).rsplit("/", 1)[-1]))
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise describe_store_error(self.remote / name, e) from e
        final = self.folder / name
        if final.exists():  # an older copy, or another rank of this host pulled it meanwhile
            shutil.rmtree(final, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:  # another rank's rename won: its copy is the same checkpoint
            shutil.rmtree(tmp, ignore_errors=True)
        return len(files)

    def _store_latest(self) -> tuple[str, int] | None:
        """``(folder name, step)`` of the store's ``latest.json``, None when it has none."""
        try:
            doc = json.loads(read_bytes(self.remote / LATEST_FILE))
        except FileNotFoundError:
            return None
        return str(doc["checkpoint"]), int(doc.get("step", 0))

    def pull_latest(self) -> int:
        """Bring the store's latest checkpoint into the working copy when the copy lacks it, with the pointer;
        returns the files copied (0: nothing to copy).

        Raises:
            StorageError: the store failed.
        """
        found = self._store_latest()
        if found is None or (self.folder / found[0] / STATE_FILE).is_file():
            return 0
        n = self._pull(found[0])
        if n:
            write_latest(self.folder, *found)
        return n + (1 if n else 0)

    def latest(self) -> Path | None:
        """The store's latest checkpoint, pulled into the working copy when the copy lacks it (a resume on another
        host); the copy's own latest when the store has none.

        Raises:
            StorageError: the store failed.
        """
        self.pull_latest()
        return super().latest()

    def resolve(self, name: str | None) -> Path:
        """See :meth:`CheckpointStore.resolve`: a folder name the working copy lacks is pulled from the store first.

        Raises:
            ModelError: no such checkpoint here or on the store.
            StorageError: the store failed.
        """
        if name and "/" not in name and not (self.folder / name / STATE_FILE).is_file():
            self._pull(name)
        return super().resolve(name)  # None: :meth:`latest`, which pulls

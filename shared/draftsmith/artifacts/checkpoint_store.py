"""The one place that picks how a run's checkpoints are stored: a
:class:`~draftsmith.artifacts.checkpoints.CheckpointStore` chosen once from the run's location (a local path or an
object-store URL, :mod:`draftsmith.artifacts.location`) and kept per process, so the trainer, a resume and an
export all go through the same one.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.artifacts.checkpoints import CheckpointStore
from draftsmith.artifacts.local_checkpoints import LocalCheckpointStore
from draftsmith.artifacts.location import Location, is_remote, local_root, run_key, run_location
from draftsmith.artifacts.object_checkpoints import CHECKPOINTS, ObjectCheckpointStore

_STORES: dict[tuple[str, str], CheckpointStore] = {}


def checkpoint_store(run_root: Location | str, stage_dir: Path) -> CheckpointStore:
    """This process's :class:`~draftsmith.artifacts.checkpoints.CheckpointStore` of the run at ``run_root``
    (``<runs_dir>/<run>``): :class:`~draftsmith.artifacts.local_checkpoints.LocalCheckpointStore` of its
    ``checkpoints/`` for a path, :class:`~draftsmith.artifacts.object_checkpoints.ObjectCheckpointStore` with its
    working copy under ``stage_dir`` for an object-store URL.

    Raises:
        StorageError: the URL's scheme has no fsspec implementation installed.
    """
    key = (run_key(run_root), str(Path(stage_dir).expanduser()))
    store = _STORES.get(key)
    if store is None:
        if is_remote(run_root):
            root = run_location(run_root)
            store = ObjectCheckpointStore(root, local_root(stage_dir, root) / CHECKPOINTS)
        else:
            store = LocalCheckpointStore(Path(key[0]) / CHECKPOINTS)
        _STORES[key] = store
    return store

"""Where extraction's shards go: :func:`feature_store` picks, once, the run's
:class:`~draftsmith.artifacts.features.FeatureStore` from its location: the local folder
(:class:`~draftsmith.features.store.LocalFeatureStore`) or an object store (:class:`ObjectFeatureStore`).

On an object store a job needs only the run's URL and Redis: it pulls the data manifest, the feature manifest and its
one data shard into the host's working copy (:func:`draftsmith.staging.local_root`), extracts there with the same
code as a local run, then pushes the feature shard and, last, its sidecar with put-if-absent, and removes both from
its copy. The store's sidecars are the set of done shards: a sidecar is only written after its shard, so a host lost
between the two leaves a shard that is redone, never a sidecar without its file.

The store's ``features/manifest.json`` is rebuilt from the listing of sidecars by ``draftsmith extract`` (when it
enqueues, and again when a later call finds nothing left), and every reader rebuilds its local copy's manifest from
the sidecars it pulled (:func:`draftsmith.staging.pull`), so a manifest written while another host was finishing a
shard never hides that shard.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as artifact
from draftsmith.artifacts.features import FeatureStore
from draftsmith.artifacts.location import (
    Location,
    is_remote,
    list_names,
    put_if_absent,
    read_bytes,
    run_location,
    write_bytes,
)
from draftsmith.artifacts.provenance import stamp
from draftsmith.features.plan import ExtractPlan, make_plan
from draftsmith.features.store import LocalFeatureStore
from draftsmith.log import get_logger
from draftsmith.staging import local_root, pull, push

if TYPE_CHECKING:
    from upath import UPath

log = get_logger(__name__)

FEATURES = artifact.FEATURES_DIR


class ObjectFeatureStore(FeatureStore):
    """The feature shards of a run on an object store, computed in a working copy under ``stage_dir`` (see the
    module docstring)."""

    keeps_shards = False

    def __init__(self, root: UPath, stage_dir: Path) -> None:
        self.root = root
        self.local = local_root(stage_dir, root)

    def working_copy(self) -> Path:
        pull(
            self.root,
            self.local,
            (f"data/{data_artifact.MANIFEST_FILE}", f"{FEATURES}/{artifact.MANIFEST_FILE}"),
        )
        return self.local

    def done_shards(self) -> set[int]:
        """One listing call over ``features/``."""
        names = (artifact.shard_index(n) for n in list_names(self.root / FEATURES, ".json"))
        return {i for i in names if i is not None}

    def sidecar(self, index: int) -> dict[str, Any] | None:
        try:
            return json.loads(read_bytes(self.root / FEATURES / artifact.sidecar_file(index)))
        except FileNotFoundError:
            return None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_bytes(
            self.root / FEATURES / artifact.MANIFEST_FILE, json.dumps(stamp(manifest), indent=1).encode()
        )
        artifact.write_manifest(self.local / FEATURES, manifest)

    def fetch(self, rels: Sequence[str]) -> None:
        pull(self.root, self.local, tuple(rels))

    def publish(self, index: int) -> bool:
        """Push shard ``index`` of the working copy, then put its sidecar if absent; then remove both from the copy
        (an extraction host's disk holds the shards it has not pushed, not the whole store). Another host may have
        finished it meanwhile (a job requeued from a worker taken for dead): its shard stands. Checking before the
        upload leaves only the upload's own seconds in which two hosts both write the file."""
        side = self.root / FEATURES / artifact.sidecar_file(index)
        mine = False
        if not side.exists():
            push(self.local, self.root, (f"{FEATURES}/{artifact.shard_file(index)}",))
            mine = put_if_absent(side, (self.local / FEATURES / artifact.sidecar_file(index)).read_bytes())
        for name in (artifact.sidecar_file(index), artifact.shard_file(index)):
            (self.local / FEATURES / name).unlink(missing_ok=True)
        return mine


def feature_store(run_root: Location | str, stage_dir: Path) -> FeatureStore:
    """The :class:`~draftsmith.artifacts.features.FeatureStore` of the run at ``run_root`` (``runs/<run>``, a path
    or an object-store URL); ``stage_dir`` holds the working copy of a run on an object store.

    Raises:
        StorageError: the URL's scheme has no fsspec implementation installed.
    """
    root = run_location(run_root)
    return ObjectFeatureStore(root, stage_dir) if is_remote(root) else LocalFeatureStore(root)


def plan_of(store: FeatureStore, s) -> ExtractPlan:
    """The extraction plan of the store's run, made on its working copy (the run itself on a local disk) with the
    settings ``s`` pointed at that copy.

    Raises:
        StorageError: the object store failed; DataError / ModelError: as :func:`draftsmith.features.plan.make_plan`.
    """
    local = store.working_copy()
    return make_plan(s.model_copy(update={"runs_dir": local.parent}), local)

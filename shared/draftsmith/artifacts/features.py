"""Target features under ``runs/<run>/features/`` (docs/formats.md §4): names, schema tags, manifest.

Layout: ``features-NNNNN.safetensors`` shards (``aux_hidden [T_total, 3*H]``, ``final_hidden [T_total, H]``
post-norm, ``offsets`` int64 ``[S+1]``), each with its sidecar ``features-NNNNN.json`` (schema
:data:`SHARD_SCHEMA`), and ``manifest.json`` (schema :data:`FEATURES_SCHEMA`) rebuilt from the sidecars.
Writer: :mod:`draftsmith.features.store`; reader: :mod:`draftsmith.drafter.data` (offline training). Extraction
reaches the run's shards through a :class:`FeatureStore` (the local folder, or the object store with a working copy
on the host), picked once from the run's location by :func:`draftsmith.features.on_store.feature_store`; every
features manifest is built by :meth:`FeatureStore.rebuild_manifest` from the complete shards' sidecars.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import Location, run_key, run_location
from draftsmith.artifacts.provenance import stamp
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import DataError

FEATURES_SCHEMA = "draftsmith.features/1"
SHARD_SCHEMA = "draftsmith.feature-shard/1"
MANIFEST_FILE = "manifest.json"
FEATURES_DIR = "features"  # under the run folder
LOCK_FILE = ".lock"


def shard_file(index: int) -> str:
    """File name of feature shard ``index`` (= data shard index): ``features-NNNNN.safetensors``."""
    return f"features-{index:05d}.safetensors"


def sidecar_file(index: int) -> str:
    """File name of the sidecar of feature shard ``index``: ``features-NNNNN.json``."""
    return f"features-{index:05d}.json"


def shard_index(name: str) -> int | None:
    """The index of the feature shard or sidecar file ``name`` (``features-00007.json`` -> 7); None for any other
    name (the manifest, temporary files)."""
    stem = name.rsplit(".", 1)[0]
    digits = stem[len("features-") :]
    return int(digits) if stem.startswith("features-") and digits.isdigit() else None


def complete_sidecars(features_dir: Path) -> list[dict[str, Any]]:
    """The sidecars of a local features folder whose shard file is there too (the complete shards), in index order.

    Raises:
        ValueError: a sidecar is not JSON.
    """
    d = Path(features_dir)
    out = []
    for side in sorted(d.glob("features-*.json")):
        i = shard_index(side.name)
        if i is not None and (d / shard_file(i)).is_file():
            out.append(json.loads(side.read_text()))
    return out


def manifest_path(features_dir: Path) -> Path:
    """``features/manifest.json``."""
    return run_location(features_dir) / MANIFEST_FILE


def write_manifest(features_dir: Path, manifest: dict[str, Any]) -> None:
    """Replace ``features/manifest.json`` atomically (indent 1); a manifest equal to the stored one is not written
    again, so that an ``extract`` with nothing to do leaves every file of the run as it was."""
    text = json.dumps(stamp(manifest), indent=1)
    try:
        if load_manifest(features_dir) == json.loads(text):
            return
    except ValueError:  # a torn or foreign file: replaced below
        pass
    atomic_write_text(manifest_path(features_dir), text)


def load_manifest(features_dir: Path) -> dict[str, Any] | None:
    """The manifest as stored, unvalidated (to compare a resumed extraction with), None when there is none.

    Raises:
        ValueError: the file is not JSON.
    """
    f = manifest_path(features_dir)
    return json.loads(f.read_text()) if f.is_file() else None


def read_manifest(features_dir: Path) -> dict[str, Any]:
    """The features manifest, checked for training: schema :data:`FEATURES_SCHEMA`, a post-norm final hidden state.

    Keys used by readers: ``hidden_size``, ``layer_ids``, ``target_model``, ``final_hidden`` and ``shards``
    (``file``, ``sample_ids``, ``lengths``, ``sha256``, ``skipped``: ``[{"id", "reason"}]``).

    Raises:
        DataError: missing, of another schema, or storing a pre-norm final hidden state.
    """
    f = manifest_path(features_dir)
    if not f.is_file():
        raise DataError(f"no features manifest at {f}", f"run the stage that writes {f.parent.name}/ first")
    m = json.loads(f.read_text())
    if m.get("schema") != FEATURES_SCHEMA:
        raise DataError(
            f"{f} has schema {m.get('schema')!r}, expected {FEATURES_SCHEMA!r}",
            "rebuild it with this version",
        )
    if m.get("final_hidden", "post_norm") != "post_norm":
        raise DataError(
            "features store a pre-norm final hidden state", "re-extract with final_hidden=post_norm"
        )
    return m


def manifest_from_sidecars(header: dict[str, Any], sides: list[dict[str, Any]]) -> dict[str, Any]:
    """A features manifest: the run-level fields of ``header`` plus ``shards``, ``samples``, ``tokens`` and
    ``skipped_samples`` from the shard sidecars ``sides`` (in shard order)."""
    keep = ("file", "data_shard", "sample_ids", "lengths", "sha256", "skipped")
    m = {
        k: v
        for k, v in header.items()
        if k not in ("shards", "samples", "tokens", "skipped_samples", "code_version")
    }
    m["shards"] = [{k: s[k] for k in keep if k in s} for s in sides]
    m["samples"] = sum(len(s["sample_ids"]) for s in sides)
    m["tokens"] = sum(s["tokens"] for s in sides)
    m["skipped_samples"] = sum(len(s.get("skipped", [])) for s in sides)
    return m


def rebuild_from_sidecars(features_dir: Path) -> dict[str, Any] | None:
    """Rewrite ``features/manifest.json`` of a local folder from its complete shards (sidecar and file both there)
    and the shards it already lists whose file is there, keeping its run-level fields; None (nothing written) when
    the folder has no manifest.

    A working copy pulled from an object store calls it: the store's manifest may have been written while another
    host was still finishing a shard, the sidecars never miss one.
    """
    header = load_manifest(features_dir)
    if header is None:
        return None
    d = Path(features_dir)
    # the manifest's own entries, then every sidecar's (a sidecar wins): no shard the manifest lists is dropped
    shards = {
        e["file"]: {**e, "tokens": sum(e["lengths"])}
        for e in header.get("shards", [])
        if (d / e["file"]).is_file()
    }
    shards.update((s["file"], s) for s in complete_sidecars(d))
    m = manifest_from_sidecars(
        header, [shards[k] for k in sorted(shards)]
    )  # file names sort as shard indices
    write_manifest(d, m)
    return m


class FeatureStore(ABC):
    """The feature shards of one run (``runs/<run>/features``), wherever the run lives: what extraction asks of
    storage. Extraction computes in a local folder (:meth:`working_copy`: the run itself on a local disk, a copy on
    the host for a run on an object store); the store keeps the hand-offs its storage needs (the lock of a local
    folder; the pulls, pushes and put-if-absent sidecars of an object store), so the stage never asks where the run
    is. A shard is done once its sidecar is in the store, written after its file.

    Attributes:
        root: the run folder (``runs/<run>``: a :class:`pathlib.Path` or an :class:`upath.UPath`).
    """

    root: Location
    # whether the working copy keeps every finished shard (a local run) or hands each over and drops it
    keeps_shards: bool = True

    @property
    def key(self) -> str:
        """The run's one spelling for jobs and messages (:func:`~draftsmith.artifacts.location.run_key`)."""
        return run_key(self.root)

    @abstractmethod
    def working_copy(self) -> Path:
        """The local run folder extraction computes in, with the data manifest and the features manifest in place.

        Raises:
            StorageError: the object store failed.
        """

    @abstractmethod
    def done_shards(self) -> set[int]:
        """Indices of the shards whose sidecar (and file) are in the store.

        Raises:
            StorageError: the object store failed.
        """

    @abstractmethod
    def sidecar(self, index: int) -> dict[str, Any] | None:
        """The sidecar of shard ``index`` when the store holds it complete, else None.

        Raises:
            StorageError: the object store failed; ValueError: the sidecar is not JSON.
        """

    @abstractmethod
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace ``features/manifest.json`` in the store (and in the working copy, when it is another folder)."""

    def fetch(self, rels: Sequence[str]) -> None:  # noqa: B027 (a local run holds its files already)
        """Bring the run's files ``rels`` (paths under the run folder) into the working copy, when it is a copy.

        Raises:
            StorageError: the object store failed.
        """

    def publish(self, index: int) -> bool:
        """Hand the finished shard ``index`` of the working copy to the store: its file, then its sidecar (the
        sidecar makes it count). Returns False when the store already held that shard from another host (theirs is
        kept). A local run wrote it in place: nothing to do.

        Raises:
            StorageError: the object store failed (what was pushed before stays; the shard is redone or pushed
                again by the next job).
        """
        return True

    def rebuild_manifest(self, header: dict[str, Any]) -> dict[str, Any]:
        """Rebuild the features manifest from the complete shards' sidecars and the run-level ``header``
        (the plan's :meth:`~draftsmith.features.plan.ExtractPlan.manifest_header`), write it and return it.

        Raises:
            StorageError: the object store failed.
        """
        sides = [side for i in sorted(self.done_shards()) if (side := self.sidecar(i)) is not None]
        m = manifest_from_sidecars(header, sides)
        self.write_manifest(m)
        return m

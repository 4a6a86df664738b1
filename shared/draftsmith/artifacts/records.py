"""Generation records under ``runs/<run>/records/`` (docs/formats.md §2): names, schema tags, sidecar reader.

Layout: one ``<job>.jsonl`` shard per job attempt (one record per line, schema :data:`RECORD_SCHEMA`), its
``<job>.meta.json`` sidecar (schema :data:`SHARD_SCHEMA`: ``shard``, ``ids``, ``count``, ``ok``, ``sha256``,
``created_at``) written last, the journal ``shards.idx`` and ``manifest.json`` (schema :data:`MANIFEST_SCHEMA`).
The records are read and written through a :class:`RecordStore`, one per records folder, picked once from its
location (:func:`draftsmith.artifacts.record_store.record_store`): :mod:`draftsmith.artifacts.local_records` on a
local disk, :mod:`draftsmith.artifacts.object_records` on an object store. Callers: :mod:`draftsmith.generation`
(writer and progress) and :mod:`draftsmith.data.records`.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from draftsmith.artifacts.location import Location, run_location
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import DataError

RECORD_SCHEMA = "draftsmith.record/1"
SHARD_SCHEMA = "draftsmith.record-shard/1"
MANIFEST_SCHEMA = "draftsmith.records-manifest/1"

MANIFEST_FILE = "manifest.json"
JOURNAL_FILE = "shards.idx"
SHARD_SUFFIX = ".jsonl"
SIDECAR_SUFFIX = ".meta.json"
LOCK_FILE = ".lock"


def manifest_path(records_dir: Location) -> Location:
    """``records/manifest.json`` (a local path, or an object on the run's store)."""
    return run_location(records_dir) / MANIFEST_FILE


def sidecar_of(shard: Path) -> Path:
    """The sidecar ``<job>.meta.json`` of shard ``<job>.jsonl``."""
    shard = run_location(shard)
    return shard.with_name(shard.name[: -len(SHARD_SUFFIX)] + SIDECAR_SUFFIX)


def shard_of(sidecar: Path) -> Path:
    """The shard ``<job>.jsonl`` of sidecar ``<job>.meta.json``."""
    sidecar = run_location(sidecar)
    return sidecar.with_name(sidecar.name[: -len(SIDECAR_SUFFIX)] + SHARD_SUFFIX)


def sidecar_files(records_dir: Path) -> list[Path]:
    """The shard sidecars of a records folder, sorted by name (hidden temporary files left out)."""
    return sorted(
        p for p in run_location(records_dir).glob("*" + SIDECAR_SUFFIX) if not p.name.startswith(".")
    )


def shard_files(records_dir: Path) -> list[Path]:
    """The record shards (``*.jsonl`` files) of a records folder, sorted by name; sidecars are not shards."""
    return sorted(p for p in run_location(records_dir).glob("*" + SHARD_SUFFIX) if p.is_file())


def read_sidecar(path: Path) -> dict[str, Any]:
    """One shard sidecar as a dict (keys: ``shard``, ``ids``, ``count``, ``ok``, ``sha256``, ``created_at``).

    Raises:
        OSError, ValueError: the file is unreadable or not JSON (callers turn this into their DataError).
    """
    return json.loads(run_location(path).read_text())


def read_manifest(records_dir: Path) -> dict[str, Any] | None:
    """``records/manifest.json`` as written by :func:`draftsmith.generation.store.rebuild_manifest`, or None when
    it is missing or not JSON (it is always rebuilt from the sidecars, which are the truth)."""
    try:
        m = json.loads(manifest_path(records_dir).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def write_manifest(records_dir: Path, manifest: dict[str, Any]) -> None:
    """Replace ``records/manifest.json`` atomically (indent 1)."""
    atomic_write_text(manifest_path(records_dir), json.dumps(manifest, indent=1))


class RecordTally(NamedTuple):
    """What the shard sidecars say is done: ``ids`` of prompts with a record, ``errors`` (records of permanent
    errors) and ``cut`` (records whose answer stopped at ``generation.max_tokens`` or the context: a turn with
    ``finish_reason: length``; counted among the successes, but not whole)."""

    ids: set[str]
    errors: int
    cut: int


def cut_answer(record: dict[str, Any]) -> bool:
    """Whether an ``ok`` record has a turn that stopped at its length limit (``finish_reason: length``)."""
    return record.get("status") == "ok" and any(
        (t or {}).get("finish_reason") == "length" for t in record.get("turns") or []
    )


def parse_shard(shard: Any, lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of shard ``shard`` (its path, for messages) from its text ``lines``; blank lines skipped.

    Raises:
        DataError: a line is not JSON (the message names the file, the line and the fix).
    """
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as e:
                raise DataError(
                    f"{shard}:{lineno} is not valid JSON",
                    f"delete the shard and its {SIDECAR_SUFFIX} to regenerate it",
                ) from e


def shard_meta(name: str, records: list[dict[str, Any]], text: bytes, created_at: str) -> dict[str, Any]:
    """The sidecar of shard ``name`` holding ``records`` (schema :data:`SHARD_SCHEMA`): its prompt ids, counts of
    records, successes and cut answers, the sha256 of its bytes ``text`` and its creation time (UTC, ISO 8601)."""
    return {
        "schema": SHARD_SCHEMA,
        "shard": name,
        "ids": [r["id"] for r in records],
        "count": len(records),
        "ok": sum(1 for r in records if r.get("status") == "ok"),
        "cut": sum(1 for r in records if cut_answer(r)),
        "sha256": hashlib.sha256(text).hexdigest(),
        "created_at": created_at,
    }


def shard_text(records: list[dict[str, Any]]) -> bytes:
    """The bytes of a shard: one JSON record per line, UTF-8."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def unreadable_sidecar(path: object, e: BaseException) -> DataError:
    """The one error for a sidecar that cannot be read (named, with the fix)."""
    return DataError(
        f"shard sidecar {path} is unreadable ({e})",
        "remove it and its .jsonl shard; those prompts will be regenerated",
    )


class DoneSet(Protocol):
    """The prompts with a record in one records folder, as a store's done index holds them (``ids``; ``in``,
    ``len``)."""

    ids: set[str]

    def __contains__(self, prompt_id: str) -> bool: ...

    def __len__(self) -> int: ...


class RecordStore(ABC):
    """The generation records of one run (``runs/<run>/records``), wherever they live: the one way stages read and
    write them. Each implementation keeps the hand-offs its storage needs to itself (a lock and a journal on a local
    disk; put-if-absent and listings on an object store), so a stage never asks where the run is.

    Every shard counts once its sidecar is written; what is done is read from the sidecars (the truth), and a prompt
    has exactly one record as readers see it.

    Attributes:
        location: the records folder (a :class:`pathlib.Path` or an :class:`upath.UPath`).
    """

    location: Location

    @abstractmethod
    def done_index(self) -> DoneSet:
        """This process's index of the done prompts, refreshed (cheap: reads only what changed since).

        Raises:
            StorageError: the object store failed; DataError: a sidecar is unreadable.
        """

    @abstractmethod
    def tally(self) -> RecordTally:
        """The done prompts, permanent-error records and cut answers, from the sidecars.

        Raises:
            DataError: a shard sidecar is unreadable (the message names it and the fix); StorageError: the store
                failed.
        """

    @abstractmethod
    def write_shard(self, name: str, records: list[dict[str, Any]]) -> tuple[Location | None, int]:
        """Write the ``records`` whose prompts are not done yet as a new shard named after job ``name`` (a retry of
        the same job writes beside it, never over), then its sidecar.

        Returns:
            (the shard, or None when nothing was new; the number of records dropped as done already).

        Raises:
            DiskSpaceError / OSError: the local disk is full; StorageError: the object store failed. Nothing counts
                as done unless its sidecar was written.
        """

    @abstractmethod
    def iter_records(self) -> Iterator[dict[str, Any]]:
        """Every prompt's record, over the shards that have a sidecar, in shard order.

        Raises:
            DataError: a shard line is not JSON; StorageError: the store failed.
        """

    @abstractmethod
    def rebuild_manifest(self) -> dict[str, Any]:
        """Rewrite ``manifest.json`` from the sidecars (schema :data:`MANIFEST_SCHEMA`) and return it."""

    def sweep(self) -> dict[str, int]:
        """Remove what interrupted writers left behind; ``{"temp_files": n, "orphan_shards": m}`` removed. Nothing to
        sweep unless the implementation says so (no write is ever half-visible on an object store)."""
        return {"temp_files": 0, "orphan_shards": 0}

    def done_ids(self) -> set[str]:
        """Ids of the prompts that have a record (ok or permanent error)."""
        return self.tally().ids

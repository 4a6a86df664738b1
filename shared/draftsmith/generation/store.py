"""Record shards of a run, as generation reads and writes them: each call goes to the run's
:class:`~draftsmith.artifacts.records.RecordStore` (:func:`~draftsmith.artifacts.record_store.record_store`: the
local folder with its lock and journal, or the object store with put-if-absent and listings), once.

The shard sidecars are the truth of what is done; ``manifest.json`` is rebuilt from them by
:func:`rebuild_manifest` (``enqueue`` runs it). docs/formats.md §2 describes the files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import Location
from draftsmith.artifacts.record_store import load_prompts, record_store  # noqa: F401 (load_prompts re-exported)
from draftsmith.artifacts.records import (  # noqa: F401 (re-exported)
    JOURNAL_FILE as JOURNAL,
)
from draftsmith.artifacts.records import (  # noqa: F401 (re-exported)
    MANIFEST_SCHEMA,
    RECORD_SCHEMA,
    SHARD_SCHEMA,
    RecordTally,
    cut_answer,
)


def done_ids(records_dir: Location) -> set[str]:
    """Ids of prompts that have a record (ok or permanent error) in any shard.

    Raises:
        DataError: a shard sidecar is unreadable (the message names it and the fix); StorageError: the store failed.
    """
    return record_store(records_dir).done_ids()


def record_tally(records_dir: Location) -> RecordTally:
    """The prompts that have a record, how many of those records are permanent errors (``status: error``) and how
    many answers were cut at their length limit, read from the shard sidecars.

    Raises:
        DataError: a shard sidecar is unreadable; StorageError: the store failed.
    """
    return record_store(records_dir).tally()


def write_shard(
    records_dir: Location, name: str, records: list[dict[str, Any]]
) -> tuple[Location | None, int]:
    """Write ``records`` as a new shard of job ``name`` unless their prompts are done already
    (:meth:`~draftsmith.artifacts.records.RecordStore.write_shard`).

    Returns:
        (shard path or None if nothing was new, number of records dropped as duplicates).

    Raises:
        DiskSpaceError / OSError: the disk is full; StorageError: the store failed; nothing partial becomes visible.
    """
    return record_store(records_dir).write_shard(name, records)


def sweep_records(records_dir: Location) -> dict[str, int]:
    """Remove what interrupted writers left in a records folder (temporary files, shards without a sidecar; nothing
    on an object store, where no write is half-visible and a lone shard may be another host's write in progress).

    Returns:
        ``{"temp_files": n, "orphan_shards": m}`` removed.
    """
    return record_store(records_dir).sweep()


def rebuild_manifest(records_dir: Location) -> dict[str, Any]:
    """Rebuild ``manifest.json`` (and, on a local disk, the journal ``shards.idx``) from the shard sidecars."""
    return record_store(records_dir).rebuild_manifest()


def iter_records(records_dir: Location) -> Iterator[dict[str, Any]]:
    """Every prompt's record over the shards that have a sidecar, in shard order (on an object store each prompt's
    first record).

    Raises:
        DataError: a shard line is not JSON (the message names the file and line); StorageError: the store failed.
    """
    return record_store(records_dir).iter_records()


# the local shard that holds the store's records in a working copy (one per pull; the next adds only new prompts)
PULLED_SHARD = "from-store"


def pull_records(root: Location, local: Path) -> int:
    """Each prompt's first record of the run at store location ``root`` (``root/records``) into the local shard
    ``from-store`` of the working copy ``local`` (``local/records``), the prompts it already holds skipped; the
    ``fetch`` of :func:`draftsmith.staging.staged` for build-data. Returns the records added.

    Raises:
        StorageError: the store failed; DataError: a shard line is not JSON.
    """
    copy = record_store(local / "records")
    have = copy.done_ids()
    fresh = [r for r in record_store(root / "records").iter_records() if r["id"] not in have]
    if fresh:
        copy.write_shard(PULLED_SHARD, fresh)
        copy.rebuild_manifest()
    return len(fresh)

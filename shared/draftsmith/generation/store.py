"""Record shards on disk: the truth of what is done.

One JSONL shard per job attempt under ``runs/<run>/records/`` with a ``.meta.json`` sidecar listing its prompt ids;
shards are written to a temporary name and renamed. Writers take an ``fcntl`` lock on ``records/.lock`` and drop
records whose prompt already has one, so a prompt has exactly one record even when a Redis flush or a killed
worker makes two jobs answer it. Each writer appends its sidecar as one line to ``shards.idx`` (the journal that
jobs read incrementally, :mod:`draftsmith.generation.runcache`); ``manifest.json`` and the journal are rebuilt
from the sidecars by :func:`rebuild_manifest` (``enqueue`` runs it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftsmith.artifacts import records as artifact
from draftsmith.artifacts.location import is_remote
from draftsmith.artifacts.provenance import code_version
from draftsmith.artifacts.records import (  # noqa: F401 (re-exported)
    MANIFEST_SCHEMA,
    RECORD_SCHEMA,
    SHARD_SCHEMA,
    RecordTally,
    cut_answer,
)
from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import DataError


@contextmanager
def records_lock(records_dir: Path) -> Iterator[None]:
    """Exclusive lock over a records folder (works across processes on one host or a shared POSIX volume)."""
    records_dir.mkdir(parents=True, exist_ok=True)
    with open(records_dir / artifact.LOCK_FILE, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _meta_files(records_dir: Path) -> list[Path]:
    return artifact.sidecar_files(records_dir)


def done_ids(records_dir: Path) -> set[str]:
    """Ids of prompts that have a record (ok or permanent error) in any shard.

    Raises:
        DataError: a shard sidecar is unreadable (the message names it and the fix).
    """
    return record_tally(records_dir)[0]


def record_tally(records_dir: Path) -> RecordTally:
    """The prompts that have a record, how many of those records are permanent errors (``status: error``) and how
    many answers were cut at their length limit, read from the shard sidecars (the source of truth for what is
    done).

    Raises:
        DataError: a shard sidecar is unreadable (the message names it and the fix).
    """
    if is_remote(records_dir):
        from draftsmith.generation import object_records

        return object_records.record_tally(records_dir)
    ids: set[str] = set()
    errors = cut = 0
    if not records_dir.is_dir():
        return RecordTally(ids, errors, cut)
    for meta in _meta_files(records_dir):
        try:
            side = artifact.read_sidecar(meta)
            ids.update(side["ids"])
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"shard sidecar {meta} is unreadable ({e})",
                            "remove it and its .jsonl shard; those prompts will be regenerated") from e
        errors += int(side.get("count", len(side["ids"]))) - int(side.get("ok", side.get("count", 0)))
        cut += int(side.get("cut", 0))
    return RecordTally(ids, errors, cut)


def write_shard(records_dir: Path, name: str, records: list[dict[str, Any]]) -> tuple[Path | None, int]:
    """Write ``records`` as shard ``<name>.jsonl`` unless their prompts are done already.

    Returns:
        (shard path or None if nothing was new, number of records dropped as duplicates).

    Raises:
        DiskSpaceError / OSError: the disk is full; nothing partial becomes visible.
    """
    if is_remote(records_dir):
        from draftsmith.generation import object_records

        return object_records.write_shard(records_dir, name, records)
    from draftsmith.generation.runcache import done_index

    with records_lock(records_dir):
        journal = records_dir / JOURNAL
        if not journal.exists():
            _write_journal(records_dir)  # an older run, or the journal was removed: rebuilt from the sidecars
        done = done_index(records_dir)
        fresh = [r for r in records if r["id"] not in done]
        dropped = len(records) - len(fresh)
        if not fresh:
            return None, dropped
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in fresh)
        shard = records_dir / f"{name}.jsonl"
        n = 1
        while shard.exists():  # a retry of the same job writes beside, never over
            shard = records_dir / f"{name}.r{n}.jsonl"
            n += 1
        atomic_write_text(shard, text)
        sidecar = artifact.sidecar_of(shard)
        meta = {
            "schema": SHARD_SCHEMA,
            "shard": shard.name,
            "ids": [r["id"] for r in fresh],
            "count": len(fresh),
            "ok": sum(1 for r in fresh if r.get("status") == "ok"),
            "cut": sum(1 for r in fresh if cut_answer(r)),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        # the sidecar makes the shard count: written last, atomically; a shard whose sidecar could not be written
        # is removed (its prompts are not done and will be generated again)
        try:
            atomic_write_text(sidecar, json.dumps(meta))
        except BaseException:
            shard.unlink(missing_ok=True)
            raise
        # the journal: one appended line, so no writer or reader re-reads every sidecar; a line lost to
        # a crash right here is restored by the next `rebuild_manifest` (enqueue), the sidecar being the truth
        line = (json.dumps({k: meta[k] for k in _JOURNAL_KEYS}) + "\n").encode()
        fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        done.ids.update(meta["ids"])
        return shard, dropped


JOURNAL = artifact.JOURNAL_FILE
_JOURNAL_KEYS = ("shard", "ids", "count", "ok", "sha256", "created_at")


def _sidecars(records_dir: Path) -> list[dict[str, Any]]:
    out = []
    for meta in _meta_files(records_dir):
        try:
            out.append(artifact.read_sidecar(meta))
        except (OSError, ValueError) as e:
            raise DataError(f"shard sidecar {meta} is unreadable ({e})",
                            "remove it and its .jsonl shard; those prompts will be regenerated") from e
    return out


def _write_journal(records_dir: Path, metas: list[dict[str, Any]] | None = None) -> None:
    """Rewrite the journal from the sidecars, unless it already lists exactly those shards (in any order: writers
    append in completion order, the rebuild writes shard order)."""
    metas = _sidecars(records_dir) if metas is None else metas
    entries = [{k: m[k] for k in _JOURNAL_KEYS} for m in metas]
    path = records_dir / JOURNAL
    try:
        old = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (FileNotFoundError, ValueError):
        old = None
    key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
    if old is not None and sorted(map(key, old)) == sorted(map(key, entries)):
        return
    atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in entries))


def sweep_records(records_dir: Path) -> dict[str, int]:
    """Remove what interrupted writers left in a records folder (under the lock, so no write is in progress):
    temporary files of atomic writes and shards without their ``.meta.json`` sidecar (never counted as done).

    On an object store nothing is swept: no write is ever half-visible there, and a shard whose sidecar is missing
    may be another host's write in progress (it is never read either way).

    Returns:
        ``{"temp_files": n, "orphan_shards": m}`` removed.
    """
    if is_remote(records_dir) or not records_dir.is_dir():
        return {"temp_files": 0, "orphan_shards": 0}
    with records_lock(records_dir):
        tmp = [p for p in records_dir.glob(".*.tmp-*")]
        orphans = [p for p in records_dir.glob("*" + artifact.SHARD_SUFFIX) if not artifact.sidecar_of(p).exists()]
        for p in tmp + orphans:
            p.unlink(missing_ok=True)
    return {"temp_files": len(tmp), "orphan_shards": len(orphans)}


def _write_manifest(records_dir: Path) -> dict[str, Any]:
    metas = _sidecars(records_dir)
    shards = [{k: m[k] for k in ("shard", "count", "ok", "sha256", "created_at")} for m in metas]
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "shards": shards,
        "records": sum(s["count"] for s in shards),
        "ok": sum(s["ok"] for s in shards),
        "code_version": code_version(),
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    old = artifact.read_manifest(records_dir)
    if old is not None and {**old, "updated_at": None} == {**manifest, "updated_at": None}:
        manifest = old  # nothing changed since it was written: keep the file (and its time) as it is
    else:
        artifact.write_manifest(records_dir, manifest)
    _write_journal(records_dir, metas)
    return manifest


def rebuild_manifest(records_dir: Path) -> dict[str, Any]:
    """Rebuild ``manifest.json`` and the journal ``shards.idx`` from the shard sidecars (under the lock).

    ``enqueue`` calls it; writers only append to the journal (the manifest's running form). On an object store the
    manifest is rebuilt from the listing (:func:`draftsmith.generation.object_records.rebuild_manifest`).
    """
    if is_remote(records_dir):
        from draftsmith.generation import object_records

        return object_records.rebuild_manifest(records_dir)
    with records_lock(records_dir):
        return _write_manifest(records_dir)


def iter_records(records_dir: Path) -> Iterator[dict[str, Any]]:
    """Every record of every shard that has a sidecar, in shard order (on an object store: each prompt's first
    record, :func:`draftsmith.generation.object_records.iter_records`).

    Raises:
        DataError: a shard line is not JSON (the message names the file and line).
    """
    if is_remote(records_dir):
        from draftsmith.generation import object_records

        yield from object_records.iter_records(records_dir)
        return
    for meta in _meta_files(records_dir):
        shard = artifact.shard_of(meta)
        with open(shard, encoding="utf-8") as f:
            yield from artifact.parse_shard(shard, f)


# the local shard that holds the store's records in a working copy (one per pull; the next adds only new prompts)
PULLED_SHARD = "from-store"


def pull_records(root, local: Path) -> int:
    """Each prompt's first record of the run at store location ``root`` (``root/records``, read by
    :func:`iter_records`) into the local shard ``from-store`` of the working copy ``local`` (``local/records``),
    the prompts it already holds skipped; the ``fetch`` of :func:`draftsmith.staging.staged` for build-data.
    Returns the records added.

    Raises:
        StorageError: the store failed; DataError: a shard line is not JSON.
    """
    records = local / "records"
    have = done_ids(records) if records.is_dir() else set()
    fresh = [r for r in iter_records(root / "records") if r["id"] not in have]
    if fresh:
        write_shard(records, PULLED_SHARD, fresh)
        rebuild_manifest(records)
    return len(fresh)


def load_prompts(path: Path) -> dict[str, dict[str, Any]]:
    """The run's prompts (``prompts.jsonl``, a local file or an object) by id; a missing file gives none.

    Raises:
        StorageError: the object store of a remote run cannot be reached (one line, the URL named).
    """
    out: dict[str, dict[str, Any]] = {}
    if is_remote(path):
        from draftsmith.artifacts.location import read_bytes

        try:
            text = read_bytes(path).decode("utf-8")  # a store failure is read_bytes' one-line StorageError
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            if line.strip():
                p = json.loads(line)
                out[p["id"]] = p
        return out
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                p = json.loads(line)
                out[p["id"]] = p
    return out

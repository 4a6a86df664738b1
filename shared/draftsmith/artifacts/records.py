"""Generation records under ``runs/<run>/records/`` (docs/formats.md §2): names, schema tags, sidecar reader.

Layout: one ``<job>.jsonl`` shard per job attempt (one record per line, schema :data:`RECORD_SCHEMA`), its
``<job>.meta.json`` sidecar (schema :data:`SHARD_SCHEMA`: ``shard``, ``ids``, ``count``, ``ok``, ``sha256``,
``created_at``) written last, the journal ``shards.idx`` and ``manifest.json`` (schema :data:`MANIFEST_SCHEMA`).
Writer: :mod:`draftsmith.generation.store`; readers: that module, :mod:`draftsmith.generation.runcache` and
:mod:`draftsmith.data.records`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from draftsmith.artifacts.location import run_location

RECORD_SCHEMA = "draftsmith.record/1"
SHARD_SCHEMA = "draftsmith.record-shard/1"
MANIFEST_SCHEMA = "draftsmith.records-manifest/1"

MANIFEST_FILE = "manifest.json"
JOURNAL_FILE = "shards.idx"
SHARD_SUFFIX = ".jsonl"
SIDECAR_SUFFIX = ".meta.json"
LOCK_FILE = ".lock"


def manifest_path(records_dir: Path) -> Path:
    """``records/manifest.json`` (a local path, or an object on the run's store)."""
    from draftsmith.artifacts.location import run_location

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
    return sorted(p for p in run_location(records_dir).glob("*" + SIDECAR_SUFFIX) if not p.name.startswith("."))


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
    from draftsmith.artifacts.storage import atomic_write_text

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
        (t or {}).get("finish_reason") == "length" for t in record.get("turns") or [])


def parse_shard(shard: Any, lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of shard ``shard`` (its path, for messages) from its text ``lines``; blank lines skipped.

    Raises:
        DataError: a line is not JSON (the message names the file, the line and the fix).
    """
    from draftsmith.errors import DataError

    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as e:
                raise DataError(f"{shard}:{lineno} is not valid JSON",
                                f"delete the shard and its {SIDECAR_SUFFIX} to regenerate it") from e

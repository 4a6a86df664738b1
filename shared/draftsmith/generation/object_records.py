"""Record shards on an object store (``runs_dir`` an ``s3://`` URL): written once, done work read from listings.

The local layer (:mod:`draftsmith.generation.store`) rests on what one POSIX file system gives: an ``flock`` over the
folder, atomic renames and an append-only journal. An object store has none of them, and workers on other machines
share nothing but the store and Redis. So here:

- a writer names each shard ``<job>.<8 random hex>.jsonl`` and creates it, then its sidecar
  ``<job>.<hex>.meta.json``, with put-if-absent (:func:`~draftsmith.artifacts.location.put_if_absent`): no object is
  ever overwritten or edited, and the sidecar, written last, is what makes the shard count;
- the set of done prompts is the union of the sidecars' ids, from a listing of ``records/``
  (:class:`ObjectDoneIndex` reads each sidecar once per process);
- before writing, a writer drops the prompts the listing shows done. Two hosts answering the same prompt at the same
  moment (a job requeued while its first worker still ran) can still both write it: readers keep the first record
  of a prompt in sidecar-name order (:func:`iter_records`), so every prompt is used exactly once and the count of
  done prompts never counts it twice;
- ``manifest.json`` is rebuilt from the listing (``enqueue`` does it), never appended to.

Shards without a sidecar (a writer died between the two PUTs) are never read; they cost only their bytes.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from draftsmith.artifacts import records as artifact
from draftsmith.artifacts.location import (
    list_names,
    put_if_absent,
    read_bytes,
    run_key,
    run_location,
    write_bytes,
)
from draftsmith.artifacts.provenance import code_version
from draftsmith.artifacts.records import RecordTally, cut_answer
from draftsmith.errors import DataError

_DONE: dict[str, ObjectDoneIndex] = {}


def _sidecar_name(shard_name: str) -> str:
    return shard_name[: -len(artifact.SHARD_SUFFIX)] + artifact.SIDECAR_SUFFIX


def _shard_name(sidecar_name: str) -> str:
    return sidecar_name[: -len(artifact.SIDECAR_SUFFIX)] + artifact.SHARD_SUFFIX


def _read_sidecar(records_dir, name: str) -> dict[str, Any]:
    try:
        return json.loads(read_bytes(records_dir / name))
    except (FileNotFoundError, ValueError) as e:
        raise DataError(f"shard sidecar {records_dir / name} is unreadable ({e})",
                        "remove it and its .jsonl shard; those prompts will be regenerated") from e


class ObjectDoneIndex:
    """Ids of the prompts done in one records prefix of an object store: each :meth:`refresh` lists the sidecars
    and reads only those not read before (sidecars are never changed once written).

    Attributes:
        ids: prompt ids with a record.
        sidecars: the sidecars read so far, by name (their JSON content).
    """

    def __init__(self, records_dir) -> None:
        self.url = run_key(records_dir)  # a string: the store's client is made again in a forked work-horse
        self.ids: set[str] = set()
        self.sidecars: dict[str, dict[str, Any]] = {}

    def refresh(self) -> None:
        """List the sidecars and read the new ones (one LIST, plus one GET per new sidecar).

        Raises:
            StorageError: the store cannot be reached; DataError: a sidecar is not JSON.
        """
        # fsspec's async clients are not fork-safe: the worker warms this index, then forks a work-horse; a path
        # made here takes the file system from fsspec's cache, which fsspec empties in a new process
        folder = run_location(self.url)
        for name in list_names(folder, artifact.SIDECAR_SUFFIX):
            if name not in self.sidecars:
                side = _read_sidecar(folder, name)
                self.sidecars[name] = side
                self.ids.update(side.get("ids") or [])

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)


def done_index(records_dir) -> ObjectDoneIndex:
    """This process's :class:`ObjectDoneIndex` of ``records_dir``, refreshed."""
    idx = _DONE.setdefault(run_key(records_dir), ObjectDoneIndex(records_dir))
    idx.refresh()
    return idx


def write_shard(records_dir, name: str, records: list[dict[str, Any]]) -> tuple[Any, int]:
    """Write the ``records`` whose prompts the listing does not show done as a new shard ``<name>.<hex>.jsonl``,
    then its sidecar; both with put-if-absent.

    Returns:
        (the shard's UPath, or None when nothing was new; the number of records dropped as done already).

    Raises:
        StorageError: the store failed; nothing counts as done unless its sidecar was written.
    """
    done = done_index(records_dir)
    fresh = [r for r in records if r["id"] not in done]
    dropped = len(records) - len(fresh)
    if not fresh:
        return None, dropped
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in fresh).encode("utf-8")
    while True:  # a random name never taken before; a clash (2^-32) just draws again
        shard = records_dir / f"{name}.{uuid.uuid4().hex[:8]}{artifact.SHARD_SUFFIX}"
        if put_if_absent(shard, text):
            break
    meta = {
        "schema": artifact.SHARD_SCHEMA,
        "shard": shard.name,
        "ids": [r["id"] for r in fresh],
        "count": len(fresh),
        "ok": sum(1 for r in fresh if r.get("status") == "ok"),
        "cut": sum(1 for r in fresh if cut_answer(r)),
        "sha256": hashlib.sha256(text).hexdigest(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    put_if_absent(records_dir / _sidecar_name(shard.name), json.dumps(meta).encode())
    done.sidecars[_sidecar_name(shard.name)] = meta
    done.ids.update(meta["ids"])
    return shard, dropped


def _first_ids(sidecars: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """For each sidecar (by name order), the ids it is the first to hold: the records readers keep."""
    seen: set[str] = set()
    out: dict[str, set[str]] = {}
    for name in sorted(sidecars):
        ids = set(sidecars[name].get("ids") or []) - seen
        out[name] = ids
        seen |= ids
    return out


def record_tally(records_dir):
    """:class:`~draftsmith.artifacts.records.RecordTally` from the listing: done ids, permanent-error records and cut
    answers (a prompt written twice by racing hosts is counted once, as its first record).

    Raises:
        StorageError, DataError: see :meth:`ObjectDoneIndex.refresh`.
    """
    idx = done_index(records_dir)
    first = _first_ids(idx.sidecars)
    errors = cut = 0
    for name, ids in first.items():
        side = idx.sidecars[name]
        if len(ids) == len(side.get("ids") or []):
            errors += int(side.get("count", 0)) - int(side.get("ok", side.get("count", 0)))
            cut += int(side.get("cut", 0))
        else:  # some of its prompts were written first elsewhere: count from its records
            for r in _shard_records(records_dir, name):
                if r["id"] in ids:
                    errors += r.get("status") != "ok"
                    cut += cut_answer(r)
    return RecordTally(set(idx.ids), errors, cut)


def _shard_records(records_dir, sidecar_name: str) -> Iterator[dict[str, Any]]:
    shard = records_dir / _shard_name(sidecar_name)
    yield from artifact.parse_shard(shard, read_bytes(shard).decode("utf-8").splitlines())


def iter_records(records_dir) -> Iterator[dict[str, Any]]:
    """Every prompt's first record, over the shards that have a sidecar, in sidecar-name order.

    Raises:
        DataError: a shard line is not JSON; StorageError: the store failed.
    """
    idx = done_index(records_dir)
    for name, ids in _first_ids(idx.sidecars).items():
        for r in _shard_records(records_dir, name):
            if r.get("id") in ids:
                ids.discard(r["id"])
                yield r


def rebuild_manifest(records_dir) -> dict[str, Any]:
    """Write ``records/manifest.json`` from the listing (one PUT that replaces the previous manifest).

    Returns:
        The manifest (schema :data:`~draftsmith.artifacts.records.MANIFEST_SCHEMA`).
    """
    idx = done_index(records_dir)
    shards = [{k: m.get(k) for k in ("shard", "count", "ok", "sha256", "created_at")}
              for _, m in sorted(idx.sidecars.items())]
    manifest = {
        "schema": artifact.MANIFEST_SCHEMA,
        "shards": shards,
        "records": sum(int(s["count"] or 0) for s in shards),
        "prompts": len(idx.ids),
        "ok": sum(int(s["ok"] or 0) for s in shards),
        "code_version": code_version(),
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_bytes(artifact.manifest_path(records_dir), json.dumps(manifest, indent=1).encode())
    return manifest

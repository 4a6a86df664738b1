"""Record shards on an object store (``runs_dir`` an ``s3://`` URL): the
:class:`~draftsmith.artifacts.records.RecordStore` whose shards are written once and whose done work is read from
listings.

The local store (:mod:`draftsmith.artifacts.local_records`) rests on what one POSIX file system gives: an ``flock``
over the folder, atomic renames and an append-only journal. An object store has none of them, and workers on other
machines share nothing but the store and Redis. So here:

- a writer names each shard ``<job>.<8 random hex>.jsonl`` and creates it, then its sidecar
  ``<job>.<hex>.meta.json``, with put-if-absent (:func:`~draftsmith.artifacts.location.put_if_absent`): no object is
  ever overwritten or edited, and the sidecar, written last, is what makes the shard count;
- the set of done prompts is the union of the sidecars' ids, from a listing of ``records/``
  (:class:`ObjectDoneIndex` reads each sidecar once per process);
- before writing, a writer drops the prompts the listing shows done. Two hosts answering the same prompt at the same
  moment (a job requeued while its first worker still ran) can still both write it: readers keep the first record
  of a prompt in sidecar-name order (:meth:`ObjectRecordStore.iter_records`), so every prompt is used exactly once
  and the count of done prompts never counts it twice;
- ``manifest.json`` is rebuilt from the listing (``enqueue`` does it), never appended to.

Shards without a sidecar (a writer died between the two PUTs) are never read; they cost only their bytes.

The store keeps the run's URL, never a client: fsspec's async clients are not fork-safe, and the rq worker warms
the store before it forks a work-horse; a path made from the URL in the horse takes a fresh client from fsspec's
cache, which fsspec empties in a new process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts import records as artifact
from draftsmith.artifacts.location import list_names, put_if_absent, read_bytes, run_location, write_bytes
from draftsmith.artifacts.provenance import code_version
from draftsmith.artifacts.records import (
    RecordStore,
    RecordTally,
    cut_answer,
    shard_meta,
    shard_text,
    unreadable_sidecar,
)

if TYPE_CHECKING:
    from upath import UPath


def _sidecar_name(shard_name: str) -> str:
    return shard_name[: -len(artifact.SHARD_SUFFIX)] + artifact.SIDECAR_SUFFIX


def _shard_name(sidecar_name: str) -> str:
    return sidecar_name[: -len(artifact.SIDECAR_SUFFIX)] + artifact.SHARD_SUFFIX


class ObjectDoneIndex:
    """Ids of the prompts done in one records prefix of an object store: each :meth:`refresh` lists the sidecars
    and reads only those not read before (sidecars are never changed once written).

    Attributes:
        url: the records prefix (a string, see the module docstring).
        ids: prompt ids with a record.
        sidecars: the sidecars read so far, by name (their JSON content).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: set[str] = set()
        self.sidecars: dict[str, dict[str, Any]] = {}

    def refresh(self) -> None:
        """List the sidecars and read the new ones (one LIST, plus one GET per new sidecar).

        Raises:
            StorageError: the store cannot be reached; DataError: a sidecar is not JSON.
        """
        folder = run_location(self.url)
        for name in list_names(folder, artifact.SIDECAR_SUFFIX):
            if name not in self.sidecars:
                try:
                    side = json.loads(read_bytes(folder / name))
                except (FileNotFoundError, ValueError) as e:
                    raise unreadable_sidecar(folder / name, e) from e
                self.sidecars[name] = side
                self.ids.update(side.get("ids") or [])

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)


class ObjectRecordStore(RecordStore):
    """The records prefix ``url`` on an object store (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.index = ObjectDoneIndex(self.url)

    @property
    def location(self) -> UPath:
        """The records prefix, made afresh (see the module docstring)."""
        return run_location(self.url)

    def done_index(self) -> ObjectDoneIndex:
        self.index.refresh()
        return self.index

    def write_shard(self, name: str, records: list[dict[str, Any]]) -> tuple[UPath | None, int]:
        """See :meth:`RecordStore.write_shard`: shard ``<name>.<hex>.jsonl`` then its sidecar, both put-if-absent."""
        done = self.done_index()
        fresh = [r for r in records if r["id"] not in done]
        dropped = len(records) - len(fresh)
        if not fresh:
            return None, dropped
        folder = self.location
        text = shard_text(fresh)
        while True:  # a random name never taken before; a clash (2^-32) just draws again
            shard = folder / f"{name}.{uuid.uuid4().hex[:8]}{artifact.SHARD_SUFFIX}"
            if put_if_absent(shard, text):
                break
        meta = shard_meta(shard.name, fresh, text, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        put_if_absent(folder / _sidecar_name(shard.name), json.dumps(meta).encode())
        done.sidecars[_sidecar_name(shard.name)] = meta
        done.ids.update(meta["ids"])
        return shard, dropped

    def _first_ids(self) -> dict[str, set[str]]:
        """For each sidecar (by name order), the ids it is the first to hold: the records readers keep."""
        sidecars = self.done_index().sidecars
        seen: set[str] = set()
        out: dict[str, set[str]] = {}
        for name in sorted(sidecars):
            ids = set(sidecars[name].get("ids") or []) - seen
            out[name] = ids
            seen |= ids
        return out

    def _shard_records(self, sidecar_name: str) -> Iterator[dict[str, Any]]:
        shard = self.location / _shard_name(sidecar_name)
        yield from artifact.parse_shard(shard, read_bytes(shard).decode("utf-8").splitlines())

    def tally(self) -> RecordTally:
        """See :meth:`RecordStore.tally`; a prompt written twice by racing hosts is counted once, as its first
        record."""
        first = self._first_ids()
        errors = cut = 0
        for name, ids in first.items():
            side = self.index.sidecars[name]
            if len(ids) == len(side.get("ids") or []):
                errors += int(side.get("count", 0)) - int(side.get("ok", side.get("count", 0)))
                cut += int(side.get("cut", 0))
            else:  # some of its prompts were written first elsewhere: count from its records
                for r in self._shard_records(name):
                    if r["id"] in ids:
                        errors += r.get("status") != "ok"
                        cut += cut_answer(r)
        return RecordTally(set(self.index.ids), errors, cut)

    def iter_records(self) -> Iterator[dict[str, Any]]:
        """Every prompt's first record, over the shards that have a sidecar, in sidecar-name order."""
        for name, ids in self._first_ids().items():
            for r in self._shard_records(name):
                if r.get("id") in ids:
                    ids.discard(r["id"])
                    yield r

    def rebuild_manifest(self) -> dict[str, Any]:
        """Write ``records/manifest.json`` from the listing (one PUT that replaces the previous manifest)."""
        idx = self.done_index()
        shards = [
            {k: m.get(k) for k in ("shard", "count", "ok", "sha256", "created_at")}
            for _, m in sorted(idx.sidecars.items())
        ]
        manifest = {
            "schema": artifact.MANIFEST_SCHEMA,
            "shards": shards,
            "records": sum(int(s["count"] or 0) for s in shards),
            "prompts": len(idx.ids),
            "ok": sum(int(s["ok"] or 0) for s in shards),
            "code_version": code_version(),
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_bytes(artifact.manifest_path(self.location), json.dumps(manifest, indent=1).encode())
        return manifest

"""Record shards on a local disk (or a shared POSIX volume): the :class:`~draftsmith.artifacts.records.RecordStore`
of a run whose ``runs_dir`` is a path.

One JSONL shard per job attempt with a ``.meta.json`` sidecar listing its prompt ids; both written to a temporary
name and renamed. Writers take an ``fcntl`` lock on ``records/.lock`` and drop records whose prompt already has one,
so a prompt has exactly one record even when a Redis flush or a killed worker makes two jobs answer it. Each writer
appends its sidecar as one line to ``shards.idx``, the journal that :class:`DoneIndex` reads incrementally (so no
writer or job re-reads every sidecar); ``manifest.json`` and the journal are rebuilt from the sidecars by
:meth:`LocalRecordStore.rebuild_manifest` (``enqueue`` runs it).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftsmith.artifacts import records as artifact
from draftsmith.artifacts.provenance import code_version
from draftsmith.artifacts.records import RecordStore, RecordTally, shard_meta, shard_text, unreadable_sidecar
from draftsmith.artifacts.storage import atomic_write_bytes, atomic_write_text

_JOURNAL_KEYS = ("shard", "ids", "count", "ok", "sha256", "created_at")


def file_version(path: Path) -> tuple[int, int, int] | None:
    """``(device, inode, size)`` of ``path``, None when it does not exist: a file replaced or appended to has
    another version, so a cache built from it knows to reload."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size


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


class DoneIndex:
    """Ids of the prompts done in one records folder, read from the journal ``shards.idx``: a refresh reads only the
    bytes appended since the last one; a replaced journal (``enqueue`` rebuilds it from the sidecars, which stay the
    truth) or a missing one is loaded again in full.

    Attributes:
        ids: prompt ids with a record.
    """

    def __init__(self, records_dir: Path) -> None:
        self.dir = Path(records_dir)
        self.path = self.dir / artifact.JOURNAL_FILE
        self.ids: set[str] = set()
        self._file: tuple[int, int] | None = None
        self._offset = 0

    def refresh(self) -> None:
        """Read what was appended since the last refresh; reload in full when the journal was replaced."""
        v = file_version(self.path)
        if v is None:
            self.ids, self._file, self._offset = set(), None, 0
            return
        if v[:2] != self._file or v[2] < self._offset:
            self.ids, self._file, self._offset = set(), v[:2], 0
        if v[2] == self._offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(v[2] - self._offset)
        end = data.rfind(b"\n") + 1  # a line still being appended is read next time
        for line in data[:end].splitlines():
            if line.strip():
                self.ids.update(json.loads(line)["ids"])
        self._offset += end

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)


class LocalRecordStore(RecordStore):
    """The records folder ``location`` on a local disk (see the module docstring)."""

    def __init__(self, location: Path) -> None:
        self.location = Path(location)
        self._done = DoneIndex(self.location)

    def done_index(self) -> DoneIndex:
        self._done.refresh()
        return self._done

    def _sidecars(self) -> list[dict[str, Any]]:
        out = []
        for meta in artifact.sidecar_files(self.location):
            try:
                out.append(artifact.read_sidecar(meta))
            except (OSError, ValueError) as e:
                raise unreadable_sidecar(meta, e) from e
        return out

    def tally(self) -> RecordTally:
        ids: set[str] = set()
        errors = cut = 0
        if not self.location.is_dir():
            return RecordTally(ids, errors, cut)
        for meta in artifact.sidecar_files(self.location):
            try:
                side = artifact.read_sidecar(meta)
                ids.update(side["ids"])
            except (OSError, ValueError, KeyError) as e:
                raise unreadable_sidecar(meta, e) from e
            errors += int(side.get("count", len(side["ids"]))) - int(side.get("ok", side.get("count", 0)))
            cut += int(side.get("cut", 0))
        return RecordTally(ids, errors, cut)

    def write_shard(self, name: str, records: list[dict[str, Any]]) -> tuple[Path | None, int]:
        d = self.location
        with records_lock(d):
            journal = d / artifact.JOURNAL_FILE
            if not journal.exists():
                self._write_journal()  # an older run, or the journal was removed: rebuilt from the sidecars
            done = self.done_index()
            fresh = [r for r in records if r["id"] not in done]
            dropped = len(records) - len(fresh)
            if not fresh:
                return None, dropped
            text = shard_text(fresh)
            shard = d / f"{name}{artifact.SHARD_SUFFIX}"
            n = 1
            while shard.exists():  # a retry of the same job writes beside, never over
                shard = d / f"{name}.r{n}{artifact.SHARD_SUFFIX}"
                n += 1
            atomic_write_bytes(shard, text)
            meta = shard_meta(shard.name, fresh, text, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            # the sidecar makes the shard count: written last, atomically; a shard whose sidecar could not be
            # written is removed (its prompts are not done and will be generated again)
            try:
                atomic_write_text(artifact.sidecar_of(shard), json.dumps(meta))
            except BaseException:
                shard.unlink(missing_ok=True)
                raise
            # the journal: one appended line; a line lost to a crash right here is restored by the next
            # rebuild_manifest (enqueue), the sidecar being the truth
            line = (json.dumps({k: meta[k] for k in _JOURNAL_KEYS}) + "\n").encode()
            fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            done.ids.update(meta["ids"])
            return shard, dropped

    def _write_journal(self, metas: list[dict[str, Any]] | None = None) -> None:
        """Rewrite the journal from the sidecars, unless it already lists exactly those shards (in any order:
        writers append in completion order, the rebuild writes shard order)."""
        metas = self._sidecars() if metas is None else metas
        entries = [{k: m[k] for k in _JOURNAL_KEYS} for m in metas]
        path = self.location / artifact.JOURNAL_FILE
        try:
            old = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (FileNotFoundError, ValueError):
            old = None
        key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
        if old is not None and sorted(map(key, old)) == sorted(map(key, entries)):
            return
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in entries))

    def sweep(self) -> dict[str, int]:
        """Remove, under the lock (so no write is in progress), temporary files of atomic writes and shards without
        their sidecar (never counted as done)."""
        d = self.location
        if not d.is_dir():
            return {"temp_files": 0, "orphan_shards": 0}
        with records_lock(d):
            tmp = list(d.glob(".*.tmp-*"))
            orphans = [p for p in d.glob("*" + artifact.SHARD_SUFFIX) if not artifact.sidecar_of(p).exists()]
            for p in tmp + orphans:
                p.unlink(missing_ok=True)
        return {"temp_files": len(tmp), "orphan_shards": len(orphans)}

    def rebuild_manifest(self) -> dict[str, Any]:
        """Rebuild ``manifest.json`` and the journal from the sidecars, under the lock; an unchanged manifest is
        left as it is (its time included)."""
        with records_lock(self.location):
            metas = self._sidecars()
            shards = [{k: m[k] for k in ("shard", "count", "ok", "sha256", "created_at")} for m in metas]
            manifest = {
                "schema": artifact.MANIFEST_SCHEMA,
                "shards": shards,
                "records": sum(s["count"] for s in shards),
                "ok": sum(s["ok"] for s in shards),
                "code_version": code_version(),
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            old = artifact.read_manifest(self.location)
            if old is not None and {**old, "updated_at": None} == {**manifest, "updated_at": None}:
                manifest = old
            else:
                artifact.write_manifest(self.location, manifest)
            self._write_journal(metas)
            return manifest

    def iter_records(self) -> Iterator[dict[str, Any]]:
        for meta in artifact.sidecar_files(self.location):
            shard = artifact.shard_of(meta)
            with open(shard, encoding="utf-8") as f:
                yield from artifact.parse_shard(shard, f)

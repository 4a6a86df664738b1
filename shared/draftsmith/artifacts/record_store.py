"""The one place that picks how a run's generation files are stored: a :class:`~draftsmith.artifacts.records.RecordStore`
for ``records/`` and a prompt index for ``prompts.jsonl``, each chosen once from the location (a local path or an
object-store URL, :mod:`draftsmith.artifacts.location`) and kept per process, so the caches they hold (the done
index, the prompts' offsets) serve every later call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsmith.artifacts.local_records import LocalRecordStore, file_version
from draftsmith.artifacts.location import (
    Location,
    describe_store_error,
    is_remote,
    read_bytes,
    run_key,
    run_location,
)
from draftsmith.artifacts.object_records import ObjectRecordStore
from draftsmith.artifacts.records import RecordStore

_STORES: dict[str, RecordStore] = {}
_PROMPTS: dict[str, PromptIndex | ObjectPromptIndex] = {}


def record_store(records_dir: Location | str) -> RecordStore:
    """This process's :class:`~draftsmith.artifacts.records.RecordStore` of the records folder ``records_dir``
    (``runs/<run>/records``): :class:`~draftsmith.artifacts.local_records.LocalRecordStore` for a path,
    :class:`~draftsmith.artifacts.object_records.ObjectRecordStore` for an object-store URL.

    Raises:
        StorageError: the URL's scheme has no fsspec implementation installed.
    """
    key = run_key(records_dir)
    store = _STORES.get(key)
    if store is None:
        store = ObjectRecordStore(key) if is_remote(records_dir) else LocalRecordStore(Path(key))
        _STORES[key] = store
    return store


class PromptIndex:
    """Byte offset of every prompt in a local ``prompts.jsonl``, built once per version of the file (``enqueue``
    replaces it atomically, so a new inode means a new version); a job reads only its own lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offsets: dict[str, int] = {}
        self._version: tuple[int, int, int] | None = None

    def refresh(self) -> None:
        """Re-index when the file changed (O(prompts), once per version); otherwise nothing."""
        v = file_version(self.path)
        if v == self._version:
            return
        offsets: dict[str, int] = {}
        if v is not None:
            with open(self.path, "rb") as f:
                pos = 0
                for line in f:
                    if line.strip():
                        offsets[json.loads(line)["id"]] = pos
                    pos += len(line)
        self.offsets, self._version = offsets, v

    def __len__(self) -> int:
        return len(self.offsets)

    def get(self, ids: list[str]) -> list[dict[str, Any]]:
        """The prompts ``ids`` that exist, in the order given (reads only their lines)."""
        out = []
        with open(self.path, "rb") as f:
            for i in ids:
                off = self.offsets.get(i)
                if off is not None:
                    f.seek(off)
                    out.append(json.loads(f.readline()))
        return out


class ObjectPromptIndex:
    """The prompts of a ``prompts.jsonl`` on an object store, held in memory and read again when its ETag (or size)
    changes (``enqueue`` replaces the object whole); one HEAD per refresh. Keeps the URL, not a client (fsspec's
    clients are not fork-safe)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prompts: dict[str, dict[str, Any]] = {}
        self._version: tuple[Any, Any] | None = None

    def refresh(self) -> None:
        """Read the object again when it changed.

        Raises:
            StorageError: the store failed.
        """
        path = run_location(self.url)
        try:
            info = path.fs.info(path.path)
        except FileNotFoundError:
            self.prompts, self._version = {}, None
            return
        except Exception as e:  # the client's own error types differ per store and version
            raise describe_store_error(path, e) from e
        v = (info.get("ETag") or info.get("etag"), info.get("size"))
        if v != self._version:
            lines = read_bytes(path).decode("utf-8").splitlines()
            prompts = (json.loads(line) for line in lines if line.strip())
            self.prompts, self._version = {p["id"]: p for p in prompts}, v

    def __len__(self) -> int:
        return len(self.prompts)

    def get(self, ids: list[str]) -> list[dict[str, Any]]:
        """The prompts ``ids`` that exist, in the order given."""
        return [self.prompts[i] for i in ids if i in self.prompts]


def prompt_index(path: Location | str) -> PromptIndex | ObjectPromptIndex:
    """This process's index of the run's ``prompts.jsonl`` at ``path`` (a file or an object), refreshed.

    Raises:
        StorageError: the object store failed.
    """
    key = run_key(path)
    idx = _PROMPTS.get(key)
    if idx is None:
        idx = ObjectPromptIndex(key) if is_remote(path) else PromptIndex(Path(key))
        _PROMPTS[key] = idx
    idx.refresh()
    return idx


def load_prompts(path: Location | str) -> dict[str, dict[str, Any]]:
    """The run's prompts (``prompts.jsonl``, a local file or an object) by id; a missing file gives none.

    Raises:
        StorageError: the object store cannot be reached (one line, the URL named).
    """
    try:
        text = read_bytes(run_location(path)).decode("utf-8")
    except FileNotFoundError:
        return {}
    prompts = (json.loads(line) for line in text.splitlines() if line.strip())
    return {p["id"]: p for p in prompts}

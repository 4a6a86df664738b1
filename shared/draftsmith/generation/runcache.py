"""Per-process caches of a run, so a generation job's fixed cost does not grow with the run.

- :class:`PromptIndex`: byte offset of every prompt in ``prompts.jsonl``, built once per version of the file (the
  file is replaced atomically by ``enqueue``, so a new inode means a new version). A job reads only its own lines.
- :class:`DoneIndex`: ids of prompts with a record, read from ``records/shards.idx``, the append-only journal of
  shards (one line per shard, the sidecar's content, appended under the records lock right after the sidecar).
  A refresh reads only the bytes appended since the last one. When the journal is replaced (``enqueue`` rebuilds
  it from the sidecars, which stay the truth) or missing, the index is loaded again in full.

The rq worker refreshes both before it forks a work-horse (:func:`warm`), so every horse inherits them and reads
only what changed since. Caches are keyed by path, one per run folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftsmith.artifacts import records as records_artifact

_PROMPTS: dict[Any, PromptIndex | ObjectPromptIndex] = {}
_DONE: dict[Path, DoneIndex] = {}


def _version(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size


class PromptIndex:
    """Offsets of the prompts of one ``prompts.jsonl`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offsets: dict[str, int] = {}
        self._version: tuple[int, int, int] | None = None

    def refresh(self) -> None:
        """Re-index when the file changed (O(prompts), once per version); otherwise nothing."""
        v = _version(self.path)
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


class DoneIndex:
    """Ids of the prompts done in one records folder (see the module docstring)."""

    def __init__(self, records_dir: Path) -> None:
        self.dir = Path(records_dir)
        self.path = self.dir / records_artifact.JOURNAL_FILE
        self.ids: set[str] = set()
        self._file: tuple[int, int] | None = None
        self._offset = 0

    def refresh(self) -> None:
        """Read what was appended since the last refresh; reload in full when the journal was replaced."""
        v = _version(self.path)
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


class ObjectPromptIndex:
    """The prompts of a ``prompts.jsonl`` on an object store, held in memory and read again when its ETag (or size)
    changes (``enqueue`` replaces the object whole); one HEAD per refresh."""

    def __init__(self, path) -> None:
        from draftsmith.artifacts.location import run_key

        self.url = run_key(path)  # a string: the store's client is made again in a forked work-horse
        self.prompts: dict[str, dict[str, Any]] = {}
        self._version: tuple[Any, Any] | None = None

    def refresh(self) -> None:
        """Read the object again when it changed."""
        from draftsmith.artifacts.location import describe_store_error, read_bytes, run_location

        path = run_location(self.url)  # fsspec's clients are not fork-safe; its cache is emptied in a new process
        try:
            info = path.fs.info(path.path)
        except FileNotFoundError:
            self.prompts, self._version = {}, None
            return
        except Exception as e:
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


def prompt_index(path: Path) -> PromptIndex:
    """This process's :class:`PromptIndex` of ``path`` (an :class:`ObjectPromptIndex` on an object store),
    refreshed."""
    from draftsmith.artifacts.location import is_remote, run_key

    if is_remote(path):
        idx = _PROMPTS.setdefault(run_key(path), ObjectPromptIndex(path))
        idx.refresh()
        return idx
    key = Path(path).resolve()
    idx = _PROMPTS.setdefault(key, PromptIndex(key))
    idx.refresh()
    return idx


def done_index(records_dir: Path) -> DoneIndex:
    """This process's :class:`DoneIndex` of ``records_dir`` (an
    :class:`~draftsmith.generation.object_records.ObjectDoneIndex` on an object store), refreshed."""
    from draftsmith.artifacts.location import is_remote

    if is_remote(records_dir):
        from draftsmith.generation.object_records import done_index as object_done_index

        return object_done_index(records_dir)
    key = Path(records_dir).resolve()
    idx = _DONE.setdefault(key, DoneIndex(key))
    idx.refresh()
    return idx


def warm(run_root: str | Path) -> None:
    """Refresh the caches of a run in this process (the rq worker calls it before forking a work-horse)."""
    from draftsmith.artifacts.location import run_location

    root = run_location(run_root)
    if root.is_dir():
        prompt_index(root / "prompts.jsonl")
        done_index(root / "records")

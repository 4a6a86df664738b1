"""A working copy of a run on an object store, for the stages that compute on local files.

Generation writes straight to the store (:mod:`draftsmith.generation.object_records`): many small writes from many
hosts. The later stages read and write large files with memory maps and torch (samples, features, checkpoints), so
a stage of a run whose ``runs_dir`` is a URL works on a local copy of the run under ``stage_dir``:

1. pull: the folders the stage reads come down from the store, each file only when the local copy lacks it or
   differs in size (a second stage on the same host downloads nothing twice). Records come down as one local shard
   holding each prompt's first record (:func:`draftsmith.generation.object_records.iter_records`), so every prompt
   is used once however many hosts answered it;
2. the stage runs unchanged on the copy (its own resume rules: finished shards and checkpoints are skipped);
3. push: every file of the folders the stage writes that the store lacks or holds with another size goes up.
   Shards, checkpoints and exports have unique names and are never changed once written, so a push never replaces
   finished work; only the manifests and ``latest.json`` are replaced, each in one PUT.

A host that dies mid-stage loses only what it had not pushed; the next run of the stage, on any host, pulls what
was pushed and resumes from there (training: from the last pushed checkpoint, :func:`push` is called after each
checkpoint).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftsmith.artifacts.location import describe_store_error, is_remote, run_key, run_location
from draftsmith.log import get_logger

log = get_logger("draftsmith.staging")

RECORDS = "records"
# the local shard that holds the store's records (one per pull; the next pull adds only prompts it lacks)
PULLED_SHARD = "from-store"


def local_root(stage_dir: Path, run_root: Any) -> Path:
    """The working copy of the run at URL ``run_root``: ``<stage_dir>/<12 hex of the URL>/<run>`` (a hash, so two
    stores or buckets with the same run name never share a copy)."""
    h = hashlib.sha1(run_key(run_root).encode()).hexdigest()[:12]
    return Path(stage_dir).expanduser() / h / run_location(run_root).name


def _remote_files(root: Any, folder: str) -> dict[str, int]:
    """Relative path -> size of every object under ``root/folder`` (empty when there is none)."""
    fs, base = root.fs, f"{root.path}/{folder}".rstrip("/")
    try:
        found = fs.find(base, detail=True, withdirs=False)
    except FileNotFoundError:
        return {}
    except Exception as e:
        raise describe_store_error(root / folder, e) from e
    out = {}
    for path, info in found.items():
        rel = str(path)[len(str(root.path)) + 1:]
        if info.get("type", "file") == "file" and not rel.rsplit("/", 1)[-1].startswith("."):
            out[rel] = int(info.get("size") or 0)
    return out


def _pull_records(root: Any, local: Path) -> int:
    """Each prompt's first record from the store into the local shard ``from-store``; returns records added."""
    from draftsmith.generation import object_records
    from draftsmith.generation.store import done_ids, rebuild_manifest, write_shard

    have = done_ids(local / RECORDS) if (local / RECORDS).is_dir() else set()
    fresh = [r for r in object_records.iter_records(root / RECORDS) if r["id"] not in have]
    if fresh:
        write_shard(local / RECORDS, PULLED_SHARD, fresh)
        rebuild_manifest(local / RECORDS)
    return len(fresh)


def pull(root: Any, local: Path, parts: Sequence[str]) -> int:
    """Copy ``parts`` of the run at ``root`` (folders like ``data``, or files like ``prompts.jsonl``; ``records``
    is read through :func:`_pull_records`) into ``local``; returns the files (or records) copied.

    Raises:
        StorageError: the store cannot be reached or refuses access.
    """
    n = 0
    for part in parts:
        if part == RECORDS:
            n += _pull_records(root, local)
            continue
        for rel, size in _remote_files(root, part).items():
            dst = local / rel
            if dst.is_file() and dst.stat().st_size == size:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.pull-{os.getpid()}")
            try:
                root.fs.get_file(f"{root.path}/{rel}", str(tmp))
            except Exception as e:
                tmp.unlink(missing_ok=True)
                raise describe_store_error(root / rel, e) from e
            tmp.replace(dst)
            n += 1
    return n


def push(local: Path, root: Any, parts: Sequence[str]) -> int:
    """Upload the files of ``parts`` (folders or files of the local copy) that the store lacks or holds with another
    size; returns how many went up. Hidden files (temporary writes) stay local.

    Raises:
        StorageError: the store cannot be reached or refuses access (what went up before stays).
    """
    n = 0
    for part in parts:
        src = local / part
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []
        remote = _remote_files(root, part)
        for f in files:
            if any(x.startswith(".") for x in f.relative_to(local).parts):
                continue
            rel = f.relative_to(local).as_posix()
            if remote.get(rel) == f.stat().st_size:
                continue
            try:
                root.fs.put_file(str(f), f"{root.path}/{rel}")
            except Exception as e:
                raise describe_store_error(root / rel, e) from e
            n += 1
    return n


@contextmanager
def staged(s, pull_parts: Sequence[str], push_parts: Sequence[str]) -> Iterator[Any]:
    """Settings for a stage: unchanged for a local run; for a run on an object store, settings whose ``runs_dir`` is
    the local working copy, with ``pull_parts`` pulled before and ``push_parts`` pushed after (also when the stage
    fails: what it finished is kept in the store).

    Raises:
        StorageError: the store cannot be reached or refuses access.
    """
    if not is_remote(s.runs_dir):
        yield s
        return
    root = run_location(s.runs_dir) / s.run
    local = local_root(s.stage_dir, root)
    local.mkdir(parents=True, exist_ok=True)
    got = pull(root, local, pull_parts)
    log.info("working copy of %s in %s: %d file(s) pulled", root, local, got)
    local_s = s.model_copy(update={"runs_dir": local.parent})
    try:
        yield local_s
    finally:
        sent = push(local, root, push_parts)
        log.info("%d file(s) of %s pushed to %s", sent, ", ".join(push_parts), root)


def pusher(s, parts: Sequence[str]):
    """A call that pushes ``parts`` of the working copy of the run of settings ``s`` (the store's, not the copy's)
    to its store now, or None for a local run: the trainer calls it after each checkpoint, so a host lost mid-run
    loses at most the steps since the last one."""
    if not is_remote(s.runs_dir):
        return None
    root = run_location(s.runs_dir) / s.run
    local = local_root(s.stage_dir, root)
    return lambda: push(local, root, parts)

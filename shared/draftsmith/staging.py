"""A working copy of a run on an object store, for the stages that compute on local files.

Generation writes straight to the store (:mod:`draftsmith.artifacts.object_records`): many small writes from many
hosts. The later stages read and write large files with memory maps and torch (samples, features), so
a stage of a run whose ``runs_dir`` is a URL works on a local copy of the run under ``stage_dir``:

1. pull: the folders the stage reads come down from the store, each file only when the local copy lacks it or
   differs in size (a second stage on the same host downloads nothing twice); a pulled ``features/manifest.json`` is
   rebuilt from the pulled sidecars. A stage that reads a folder through its own format pulls it itself, through
   ``staged(fetch=...)``: build-data takes the records as one local shard holding each prompt's first record
   (:func:`draftsmith.generation.store.pull_records`), so every prompt is used once however many hosts answered it;
2. the stage runs unchanged on the copy (its own resume rules: finished shards and checkpoints are skipped);
3. push: every file of the folders the stage writes that the store lacks or holds with another size goes up,
   JSON files (sidecars, manifests, ``latest.json``) after the files they describe; the files a stage rewrites in
   place (manifests, ``latest.json``, ``config.yaml``, status snapshots) go up every time.
   Shards, checkpoints and exports have unique names and are never changed once written, so a push never replaces
   finished work; only the manifests and ``latest.json`` are replaced, each in one PUT.

A host that dies mid-stage loses only what it had not pushed; the next run of the stage, on any host, pulls what
was pushed and resumes from there. Checkpoints do not travel this way: the run's checkpoint store
(:mod:`draftsmith.artifacts.object_checkpoints`) sends each one up as it is saved and brings down the latest one
(or one named) when a trainer or an export asks for it; a pull of ``checkpoints`` here goes through that store.

This module sits below the stages (docs/architecture.md): it copies files and knows the artifacts' pointers and
manifests (:mod:`draftsmith.artifacts`), never a stage's code."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as features_artifact
from draftsmith.artifacts import records as records_artifact
from draftsmith.artifacts.checkpoints import LATEST_FILE
from draftsmith.artifacts.location import (
    Location,
    describe_store_error,
    is_remote,
    local_root,
    run_location,
)
from draftsmith.artifacts.object_checkpoints import CHECKPOINTS, ObjectCheckpointStore
from draftsmith.log import get_logger

if TYPE_CHECKING:
    from upath import UPath

log = get_logger("draftsmith.staging")

FEATURES = "features"
STATUS = "status"
# rewritten in place by the stages (a new version may have the old one's size): pushed every time
REPLACED = frozenset({LATEST_FILE, data_artifact.MANIFEST_FILE, features_artifact.MANIFEST_FILE,
                      records_artifact.MANIFEST_FILE, "config.yaml"})


def _remote_files(root: UPath, folder: str) -> dict[str, int]:
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


def _pull_latest_checkpoint(root: UPath, local: Path) -> int:
    """``checkpoints/latest.json`` and the one folder it names, through the run's checkpoint store: a resume and an
    export need no other (an older checkpoint is pulled by naming its folder, ``checkpoints/step-XXXXXXXX``).
    Returns the files copied."""
    return ObjectCheckpointStore(root, local / CHECKPOINTS).pull_latest()


def pull(root: UPath, local: Path, parts: Sequence[str]) -> int:
    """Copy ``parts`` of the run at ``root`` (folders like ``data``, or files like ``prompts.jsonl``; ``checkpoints``
    as the latest one, :func:`_pull_latest_checkpoint`) into ``local``; returns the files copied.

    Raises:
        StorageError: the store cannot be reached or refuses access.
        ValueError: ``records`` among ``parts``: records are read through their own format
            (:func:`draftsmith.generation.store.pull_records`, ``staged(fetch=...)``).
    """
    if "records" in parts:
        raise ValueError("records are pulled by draftsmith.generation.store.pull_records (staged(fetch=...)), "
                         "not copied file by file")
    n = 0
    for part in parts:
        if part == CHECKPOINTS:
            n += _pull_latest_checkpoint(root, local)
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
        if part == FEATURES:
            # the store's manifest may predate a shard another host finished
            features_artifact.rebuild_from_sidecars(local / FEATURES)
    return n


def push(local: Path, root: UPath, parts: Sequence[str]) -> int:
    """Upload the files of ``parts`` (folders or files of the local copy) that the store lacks or holds with another
    size; returns how many went up. Hidden files (temporary writes) stay local.

    Raises:
        StorageError: the store cannot be reached or refuses access (what went up before stays).
    """
    n = 0
    for part in parts:
        src = local / part
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []
        # sidecars and states after the files they describe, and the part's own pointers and manifests last
        files.sort(key=lambda f: (f.suffix == ".json", f.parent == src))
        remote = _remote_files(root, part)
        for f in files:
            if any(x.startswith(".") for x in f.relative_to(local).parts):
                continue
            rel = f.relative_to(local).as_posix()
            replaced = f.name in REPLACED or rel.startswith(f"{STATUS}/")
            if remote.get(rel) == f.stat().st_size and not replaced:
                continue
            try:
                root.fs.put_file(str(f), f"{root.path}/{rel}")
            except Exception as e:
                raise describe_store_error(root / rel, e) from e
            n += 1
    return n


@contextmanager
def staged(s, pull_parts: Sequence[str], push_parts: Sequence[str],
           fetch: Callable[[Location, Path], int] | None = None) -> Iterator[Any]:
    """Settings for a stage: unchanged for a local run; for a run on an object store, settings whose ``runs_dir`` is
    the local working copy, with ``pull_parts`` pulled before and ``push_parts`` pushed after (also when the stage
    fails: what it finished is kept in the store).

    Args:
        fetch: ``fetch(root, local)``, the stage's own pull of what it reads through a format rather than file by
            file (build-data: :func:`draftsmith.generation.store.pull_records`), called after ``pull_parts`` with
            the run's store location and its working copy; returns what it added.

    Raises:
        StorageError: the store cannot be reached or refuses access.
    """
    if not is_remote(s.runs_dir):
        yield s
        return
    root = run_location(s.runs_dir) / s.run
    local = local_root(s.stage_dir, root)
    local.mkdir(parents=True, exist_ok=True)
    got = pull(root, local, pull_parts) + (fetch(root, local) if fetch else 0)
    log.info("working copy of %s in %s: %d file(s) pulled", root, local, got)
    local_s = s.model_copy(update={"runs_dir": local.parent})
    try:
        yield local_s
    finally:
        sent = push(local, root, push_parts)
        log.info("%d file(s) of %s pushed to %s", sent, ", ".join(push_parts), root)

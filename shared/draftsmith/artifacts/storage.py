"""Writing a run's files so that no reader ever sees half of one: the storage layer every artifact goes through.

A file is written under a temporary name beside its final one, flushed to disk and renamed over it
(``os.replace`` is atomic on POSIX file systems); a failed write (a full disk) removes the temporary file and
leaves the previous content in place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from draftsmith.artifacts.location import Location, is_remote, probe, write_bytes
from draftsmith.errors import DiskSpaceError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name and ``os.replace``: readers never see half a file.

    The temporary file (``.<name>.tmp-<pid>``) is removed when the write fails (a full disk), so a failure leaves
    nothing behind; ``path`` keeps its previous content.

    On an object store (``path`` an UPath, :mod:`draftsmith.artifacts.location`) one PUT does the same: readers see
    the previous object or the new one.

    Raises:
        OSError: the write failed (ENOSPC on a full disk); nothing partial is visible.
        StorageError: the object store failed.
    """
    if is_remote(path):
        write_bytes(path, data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Text variant of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def check_disk(path: Path, min_free_gb: float, mkdir: bool = True) -> None:
    """Raises DiskSpaceError when the filesystem of ``path`` has less than ``min_free_gb`` GB free (an object store
    has no disk to check here: its own errors say when it is full)."""
    if is_remote(path):
        return
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        return
    free = shutil.disk_usage(path).free / 1e9
    if free < min_free_gb:
        raise DiskSpaceError(
            f"only {free:.2f} GB free under {path} (generation.min_free_disk_gb = {min_free_gb})",
            "free some space or point runs_dir at a bigger disk; finished shards are kept",
        )


def free_gb(location: Location | str) -> float:
    """Free GB of the local disk that holds (or will hold) ``location``: that of its nearest existing parent;
    infinite on an object store (no disk of this host fills up)."""
    if is_remote(location):
        return float("inf")
    p = Path(location).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / 1e9


def reachable_here(root: Location | str) -> bool:
    """Whether this host can reach the run folder ``root``: an object store from anywhere (its own errors say
    otherwise), a local path only where the folder exists (a host without the run's mount cannot)."""
    return is_remote(root) or Path(root).is_dir()


def prepare_run(root: Location, *folders: Location) -> None:
    """Make a run folder ready for writing: create ``root`` and ``folders`` on a local disk; on an object store
    (no folders there) check that the store answers and its bucket exists instead.

    Raises:
        StorageError: the object store is unreachable, refuses access or lacks the bucket.
        OSError: a local folder cannot be created.
    """
    if is_remote(root):
        probe(root)
        return
    Path(root).mkdir(parents=True, exist_ok=True)
    for f in folders:
        Path(f).mkdir(parents=True, exist_ok=True)

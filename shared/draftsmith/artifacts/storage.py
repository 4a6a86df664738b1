"""Writing a run's files so that no reader ever sees half of one: the storage layer every artifact goes through.

A file is written under a temporary name beside its final one, flushed to disk and renamed over it
(``os.replace`` is atomic on POSIX file systems); a failed write (a full disk) removes the temporary file and
leaves the previous content in place.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name and ``os.replace``: readers never see half a file.

    The temporary file (``.<name>.tmp-<pid>``) is removed when the write fails (a full disk), so a failure leaves
    nothing behind; ``path`` keeps its previous content.

    Raises:
        OSError: the write failed (ENOSPC on a full disk); nothing partial is visible.
    """
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

"""The one logging setup: a fixed line format on stderr, flushed at once (no "Hmm, empty" log files)."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
DATEFMT = "%H:%M:%S"


def setup_logging(level: str | int = "INFO") -> None:
    """Configure the root logger once per process.

    Lines go to stderr unbuffered, so a log redirected to a file shows every phase as it happens
    (failure mode 3 in ``../shared/notes/failure-modes.md``). Calling it again only changes the level.
    """
    root = logging.getLogger()
    if not any(getattr(h, "_draftsmith", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
        handler._draftsmith = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    for noisy in ("httpx", "httpcore", "urllib3", "filelock", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    """Return the logger of a module (pass ``__name__``)."""
    return logging.getLogger(name)

"""The one logging setup: a fixed line format on stderr, flushed at once (no "Hmm, empty" log files)."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
DATEFMT = "%H:%M:%S"


MASK = "**********"


class RedactSecrets(logging.Filter):
    """Masks the process's secrets (target API key, Redis password) in every log line, whoever logs it."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            masked = msg
            for secret in self.secrets:
                masked = masked.replace(secret, MASK)
            if masked != msg:
                record.msg, record.args = masked, None
        return True


_REDACT = RedactSecrets()


def setup_logging(level: str | int = "INFO", secrets: tuple[str | None, ...] = ()) -> None:
    """Configure the root logger once per process.

    Lines go to stderr unbuffered, so a log redirected to a file shows every phase as it happens
    (an operator's log once stayed empty for 35 s behind Python's output buffering). Calling it again only changes the level and adds
    ``secrets`` (strings masked in every line; values shorter than 4 characters are ignored).
    """
    root = logging.getLogger()
    if not any(getattr(h, "_draftsmith", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
        handler.addFilter(_REDACT)
        handler._draftsmith = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    _REDACT.secrets.update(x for x in secrets if x and len(x) >= 4)
    root.setLevel(level if isinstance(level, int) else level.upper())
    for noisy in ("httpx", "httpcore", "urllib3", "filelock", "asyncio", "botocore", "aiobotocore", "s3fs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    """Return the logger of a module (pass ``__name__``)."""
    return logging.getLogger(name)

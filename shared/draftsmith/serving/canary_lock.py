"""One canary trial per run at a time (and one refresh loop per run): a Redis lock held for the trial, renewed by a
heartbeat, expiring when its holder dies.

redis-py's :class:`redis.lock.Lock` (a token under a key with a TTL, released only by its holder) under
``<prefix>:serving:<run>:canary-lock`` (``refresh-lock`` for the refresh loop, ``serving/refresh.py``). A heartbeat thread renews the TTL every third of ``timeout_s``; a canary
killed mid-trial stops renewing, the key expires ``timeout_s`` later and the run is free again, while the routes it
had not yet changed still send every request to the serving drafter.
"""

from __future__ import annotations

import threading

import redis

from draftsmith.errors import DraftsmithError
from draftsmith.log import get_logger

log = get_logger(__name__)


class CanaryBusy(DraftsmithError):
    """Another canary holds the run's trial lock."""


def lock_key(prefix: str, run: str, name: str = "canary") -> str:
    """The Redis key of ``run``'s ``name`` lock (``canary``: the trial lock; ``refresh``: the refresh loop's)."""
    return f"{prefix}:serving:{run}:{name}-lock"


class TrialLock:
    """Context manager: hold ``run``'s trial lock (or the lock ``name``), renewed in the background, released on exit.

    Args:
        name: which lock: ``canary`` (a trial) or ``refresh`` (a refresh loop's cycle).
        busy: the error raised when another holder has it, with ``holder`` naming that holder in its message.

    Raises (on enter):
        CanaryBusy (or ``busy``): another holder has it; the message says when it expires at the latest.
    """

    def __init__(self, client: redis.Redis, prefix: str, run: str, timeout_s: float = 60.0, name: str = "canary",
                 busy: type[DraftsmithError] = CanaryBusy, holder: str = "canary trial") -> None:
        self.key = lock_key(prefix, run, name)
        self.name, self.busy, self.holder = name, busy, holder
        self.timeout_s = timeout_s
        self.client = client
        self.lock = client.lock(self.key, timeout=timeout_s, thread_local=False)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> TrialLock:
        if not self.lock.acquire(blocking=False):
            ttl = self.client.pttl(self.key)
            raise self.busy(
                f"another {self.holder} holds the run's lock ({self.key}; it expires within "
                f"{max(ttl, 0) / 1000:.0f} s if its holder stopped)",
                f"wait for that {self.holder} to end (drafters/decisions.jsonl), or retry once the lock has expired",
            )
        self._beat = threading.Thread(target=self._heartbeat, name=f"{self.name}-lock-heartbeat", daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.timeout_s / 3):
            try:
                self.lock.reacquire()
            except (redis.RedisError, redis.exceptions.LockError) as e:
                log.warning("could not renew the %s lock %s: %s", self.name, self.key, e)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            self.lock.release()
        except redis.exceptions.LockError:
            log.warning("the %s lock %s had expired before its holder ended", self.name, self.key)

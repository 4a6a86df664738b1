"""One canary trial per run at a time: a Redis lock held for the trial, renewed by a heartbeat, expiring when its
holder dies.

redis-py's :class:`redis.lock.Lock` (a token under a key with a TTL, released only by its holder) under
``<prefix>:serving:<run>:canary-lock``. A heartbeat thread renews the TTL every third of ``timeout_s``; a canary
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


def lock_key(prefix: str, run: str) -> str:
    """The Redis key of ``run``'s trial lock."""
    return f"{prefix}:serving:{run}:canary-lock"


class TrialLock:
    """Context manager: hold ``run``'s trial lock, renewed in the background, released on exit.

    Raises (on enter):
        CanaryBusy: another holder has it; the message says when it expires at the latest.
    """

    def __init__(self, client: redis.Redis, prefix: str, run: str, timeout_s: float = 60.0) -> None:
        self.key = lock_key(prefix, run)
        self.timeout_s = timeout_s
        self.client = client
        self.lock = client.lock(self.key, timeout=timeout_s, thread_local=False)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> TrialLock:
        if not self.lock.acquire(blocking=False):
            ttl = self.client.pttl(self.key)
            raise CanaryBusy(
                f"another canary trial holds the run's lock ({self.key}; it expires within "
                f"{max(ttl, 0) / 1000:.0f} s if its holder stopped)",
                "wait for that trial's decision (drafters/decisions.jsonl), or retry once the lock has expired",
            )
        self._beat = threading.Thread(target=self._heartbeat, name="canary-lock-heartbeat", daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.timeout_s / 3):
            try:
                self.lock.reacquire()
            except (redis.RedisError, redis.exceptions.LockError) as e:
                log.warning("could not renew the canary lock %s: %s", self.key, e)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            self.lock.release()
        except redis.exceptions.LockError:
            log.warning("the canary lock %s had expired before the trial ended", self.key)

"""The in-flight cap shared by every worker: a Redis sorted-set semaphore with short, renewed, owned leases.

Each request holds a lease: a member ``<host>:<pid>:<uuid>`` of a sorted set scored by its expiry time. The
holder renews its leases every ``lease_s / 3`` seconds while it lives (:meth:`InflightCap.renew`), so a lease
outlives its holder by at most ``lease_s`` (a whole machine lost), and the rq worker that saw its work-horse die
returns that horse's leases at once (:meth:`InflightCap.release_owner`). A long request never loses its lease,
whatever the request timeout.

The cap is per stage: ``<prefix>:inflight:<stage>:cap``, set by a worker pool that serves that stage's queue from
its ``generation.concurrency``, so an extraction pool with ``--concurrency 1`` never touches the generators' cap.
Every job of every worker of the stage reads the same cap, across processes and machines.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import redis

_ACQUIRE = """
local key, cap_key = KEYS[1], KEYS[2]
local now, expiry, member, default_cap = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local cap = tonumber(redis.call('GET', cap_key) or default_cap)
if redis.call('ZCARD', key) < cap then
  redis.call('ZADD', key, expiry, member)
  return 1
end
return 0
"""

DEFAULT_LEASE_S = 30.0


def owner_id(pid: int | None = None) -> str:
    """The lease owner tag of process ``pid`` (default: this one): ``<host>:<pid>``."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


class InflightCap:
    """Shared cap on requests in flight across processes and machines, for one stage.

    Args:
        client: Redis client.
        prefix: Redis key prefix (``redis.prefix``).
        default_cap: cap used when no pool has set one.
        lease_s: how long a lease lives without renewal, in seconds (the holder renews it every ``lease_s / 3``).
        stage: the stage whose cap this is (``generate``).
    """

    def __init__(self, client: redis.Redis, prefix: str, default_cap: int, lease_s: float = DEFAULT_LEASE_S,
                 stage: str = "generate") -> None:
        self.client = client
        self.key = f"{prefix}:inflight:{stage}"
        self.cap_key = f"{self.key}:cap"
        self.default_cap = default_cap
        self.lease_s = lease_s if lease_s and lease_s > 0 else DEFAULT_LEASE_S
        self._acquire = client.register_script(_ACQUIRE)
        self._held: set[str] = set()

    def set_cap(self, cap: int) -> None:
        """Set the cap every job of this stage reads (a worker pool serving the stage calls this at start)."""
        self.client.set(self.cap_key, int(cap))

    def cap(self) -> int:
        """The cap in force now (the pool's, else ``default_cap``)."""
        v = self.client.get(self.cap_key)
        return int(v) if v is not None else self.default_cap

    def try_acquire(self) -> str | None:
        """Take a lease if the cap allows; returns its token or None."""
        token = f"{owner_id()}:{uuid.uuid4().hex}"
        now = time.time()
        ok = self._acquire(keys=[self.key, self.cap_key], args=[now, now + self.lease_s, token, self.default_cap])
        if ok:
            self._held.add(token)
            return token
        return None

    async def acquire(self, poll_s: float = 0.02) -> str:
        """Wait for a lease (polls; the Redis round trip is far below a generation's latency)."""
        while True:
            token = await asyncio.to_thread(self.try_acquire)
            if token:
                return token
            await asyncio.sleep(poll_s)

    def release(self, token: str) -> None:
        """Return a lease."""
        self._held.discard(token)
        self.client.zrem(self.key, token)

    def renew(self) -> int:
        """Push the expiry of every lease this object holds ``lease_s`` ahead; returns how many were renewed.

        A lease that expired meanwhile (the process stalled for ``lease_s``) is not re-created (``ZADD XX``).
        """
        held = list(self._held)
        if not held:
            return 0
        expiry = time.time() + self.lease_s
        self.client.zadd(self.key, {t: expiry for t in held}, xx=True)
        return len(held)

    async def keep_renewed(self) -> None:
        """Renew this object's leases every ``lease_s / 3`` seconds until cancelled (run it beside the requests)."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await asyncio.to_thread(self.renew)
            except redis.RedisError:
                pass  # Redis away for a moment: the next renewal (or the lease's expiry) settles it

    def release_owner(self, pid: int) -> int:
        """Return every lease of process ``pid`` on this host (its holder died); returns how many."""
        tokens = [m for m, _ in self.client.zscan_iter(self.key, match=f"{owner_id(pid)}:*")]
        if tokens:
            self.client.zrem(self.key, *tokens)
        return len(tokens)

    def in_flight(self) -> int:
        """Live leases now (all workers)."""
        self.client.zremrangebyscore(self.key, "-inf", time.time())
        return int(self.client.zcard(self.key))

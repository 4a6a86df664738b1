"""The in-flight cap shared by every worker: a Redis sorted-set semaphore with expiring leases.

Each request holds a lease (a member of a sorted set scored by its expiry time). A lease of a killed process
expires by itself, so a crash never leaks capacity. The cap lives in Redis (``<prefix>:inflight:cap``), set by the
worker pool from ``generation.concurrency``; every job of every worker reads the same cap.
"""

from __future__ import annotations

import asyncio
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


class InflightCap:
    """Shared cap on requests in flight across processes and machines.

    Args:
        client: Redis client.
        prefix: Redis key prefix (``redis.prefix``).
        default_cap: cap used when the pool has not set one.
        lease_s: how long a lease lives without release (longer than the request timeout).
    """

    def __init__(self, client: redis.Redis, prefix: str, default_cap: int, lease_s: float) -> None:
        self.client = client
        self.key = f"{prefix}:inflight"
        self.cap_key = f"{prefix}:inflight:cap"
        self.default_cap = default_cap
        self.lease_s = lease_s
        self._acquire = client.register_script(_ACQUIRE)

    def set_cap(self, cap: int) -> None:
        """Set the cap every job reads (the worker pool calls this at start)."""
        self.client.set(self.cap_key, int(cap))

    def try_acquire(self) -> str | None:
        """Take a lease if the cap allows; returns its token or None."""
        token = uuid.uuid4().hex
        now = time.time()
        ok = self._acquire(keys=[self.key, self.cap_key], args=[now, now + self.lease_s, token, self.default_cap])
        return token if ok else None

    async def acquire(self, poll_s: float = 0.02) -> str:
        """Wait for a lease (polls; the Redis round trip is far below a generation's latency)."""
        while True:
            token = await asyncio.to_thread(self.try_acquire)
            if token:
                return token
            await asyncio.sleep(poll_s)

    def release(self, token: str) -> None:
        """Return a lease."""
        self.client.zrem(self.key, token)

    def in_flight(self) -> int:
        """Live leases now (all workers)."""
        self.client.zremrangebyscore(self.key, "-inf", time.time())
        return int(self.client.zcard(self.key))

"""The in-flight cap shared by every worker: a Redis sorted-set semaphore with short, renewed, owned leases.

Each request holds a lease: a member ``<owner>:<pid>:<uuid>`` of a sorted set scored by its expiry time, where
``<owner>`` is a random id drawn once per process tree (:func:`owner_id`): two containers, or two pid namespaces,
with the same host name and the same pids never share an owner. The
holder renews its leases every ``lease_s / 3`` seconds while it lives (:meth:`InflightCap.renew`), so a lease
outlives its holder by at most ``lease_s`` (a whole machine lost), and the rq worker that saw its work-horse die
returns that horse's leases at once (:meth:`InflightCap.release_owner`). A long request never loses its lease,
whatever the request timeout.

The cap is per stage and per target: ``<prefix>:inflight:<stage>:<target>:cap`` (``<target>`` the host and port of
the target's URL, :func:`target_tag`), set by a worker pool that serves that stage's queue from its
``generation.concurrency``, so an extraction pool with ``--concurrency 1`` never touches the generators' cap, and two
targets behind one Redis keep a cap each. Every job of every worker of the stage that talks to the same target reads
the same cap, across processes and machines.
"""

from __future__ import annotations

import asyncio
import os
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

# One round trip for a batch of lease traffic: return the released leases (ARGV[5..4+n_release]), then grant as many
# of the wanted ones (the rest of ARGV) as the cap allows. Returns how many were granted (the first ones).
_EXCHANGE = """
local key, cap_key = KEYS[1], KEYS[2]
local now, expiry, default_cap, n_release = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 5, 4 + n_release do redis.call('ZREM', key, ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local cap = tonumber(redis.call('GET', cap_key) or default_cap)
local free = cap - redis.call('ZCARD', key)
local granted = 0
for i = 5 + n_release, #ARGV do
  if granted >= free then break end
  redis.call('ZADD', key, expiry, ARGV[i])
  granted = granted + 1
end
return granted
"""

DEFAULT_LEASE_S = 30.0


# Drawn at import, before the rq worker forks its work-horses: a horse inherits its worker's id, so the worker can
# name the leases of a horse that died (release_owner). A fresh interpreter (another worker, another host) draws anew.
_PROCESS_TREE_ID = uuid.uuid4().hex[:12]


def owner_id(pid: int | None = None) -> str:
    """The lease owner tag of process ``pid`` (default: this one) of this process tree: ``<random id>:<pid>``."""
    return f"{_PROCESS_TREE_ID}:{os.getpid() if pid is None else pid}"


def target_tag(url: str | None) -> str:
    """The part of a cap's key that names the target: ``host:port`` of its URL, lower-case, without credentials
    (``"default"`` when no URL is known)."""
    if not url:
        return "default"
    from urllib.parse import urlsplit

    u = urlsplit(url if "://" in url else f"http://{url}")
    host = (u.hostname or "default").lower()
    return f"{host}:{u.port}" if u.port else host


class InflightCap:
    """Shared cap on requests in flight across processes and machines, for one stage.

    Args:
        client: Redis client.
        prefix: Redis key prefix (``redis.prefix``).
        default_cap: cap used when no pool has set one.
        lease_s: how long a lease lives without renewal, in seconds (the holder renews it every ``lease_s / 3``).
        stage: the stage whose cap this is (``generate``).
        target: the target's URL (:func:`target_tag`): workers of different targets keep different caps.
    """

    def __init__(self, client: redis.Redis, prefix: str, default_cap: int, lease_s: float = DEFAULT_LEASE_S,
                 stage: str = "generate", target: str | None = None) -> None:
        self.client = client
        self.prefix, self.stage = prefix, stage
        self.key = f"{prefix}:inflight:{stage}:{target_tag(target)}"
        self.cap_key = f"{self.key}:cap"
        self.default_cap = default_cap
        self.lease_s = lease_s if lease_s and lease_s > 0 else DEFAULT_LEASE_S
        self._acquire = client.register_script(_ACQUIRE)
        self._exchange = client.register_script(_EXCHANGE)
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

    def exchange(self, release: list[str], want: int) -> list[str]:
        """Return the leases ``release`` and take up to ``want`` new ones, in one Redis round trip; returns the
        tokens granted (fewer than ``want`` when the cap is reached).

        Raises:
            redis.RedisError: Redis does not answer (nothing was granted; ``release`` was not returned).
        """
        tokens = [f"{owner_id()}:{uuid.uuid4().hex}" for _ in range(max(0, want))]
        now = time.time()
        n = int(self._exchange(keys=[self.key, self.cap_key],
                               args=[now, now + self.lease_s, self.default_cap, len(release), *release, *tokens]))
        for tok in release:
            self._held.discard(tok)
        granted = tokens[:n]
        self._held.update(granted)
        return granted

    def held(self) -> list[str]:
        """The leases this object holds now (granted, not yet returned)."""
        return list(self._held)

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

    def _stage_keys(self) -> list[str]:
        """The lease sets of this stage, every target's."""
        keys = self.client.scan_iter(match=f"{self.prefix}:inflight:{self.stage}:*", _type="zset")
        return sorted({k.decode() if isinstance(k, bytes) else k for k in keys} | {self.key})

    def release_owner(self, pid: int) -> int:
        """Return every lease of process ``pid`` of this process tree (its holder died), whichever target it was
        for; returns how many."""
        n = 0
        for key in self._stage_keys():
            tokens = [m for m, _ in self.client.zscan_iter(key, match=f"{owner_id(pid)}:*")]
            if tokens:
                n += self.client.zrem(key, *tokens)
        return n

    def in_flight(self) -> int:
        """Live leases now (all workers) for this target."""
        self.client.zremrangebyscore(self.key, "-inf", time.time())
        return int(self.client.zcard(self.key))

    def in_flight_all_targets(self) -> int:
        """Live leases now of this stage, summed over every target."""
        now, n = time.time(), 0
        for key in self._stage_keys():
            self.client.zremrangebyscore(key, "-inf", now)
            n += int(self.client.zcard(key))
        return n


class LeaseBroker:
    """One job's door to the in-flight cap: its requests' lease traffic, batched into one Redis round trip per tick.

    A request awaits :meth:`acquire` and calls :meth:`release` (no I/O) when its attempt ends. A single task takes
    every release and every waiting request gathered since its last round trip to Redis and settles them with
    :meth:`InflightCap.exchange`; when the cap is full it polls, first after ``poll_s`` seconds, then
    twice as long each time nothing is granted, up to ``max_poll_s`` (a release of its own job or a new request
    cuts the wait short). Against a fast server
    this replaces two round trips per request (they cost the pool more than the request itself) by one per
    tick, and the event loop never waits on Redis. A lease released while another request of the job waits goes
    to that request at once, as a semaphore would hand it on (against vLLM CPU a lease that waited for the next
    tick left the server's batch one request short). Leases move between jobs only through Redis, so a
    job keeps what it holds while it has requests waiting, and the cap stays the one limit. The cap, the leases,
    their owners and their renewal are :class:`InflightCap`'s, unchanged.

    Raises (from :meth:`acquire`):
        redis.RedisError: Redis did not answer; every waiting request gets the error, as a direct call would.
    """

    def __init__(self, cap: InflightCap, poll_s: float = 0.02, max_poll_s: float = 0.32) -> None:
        self.cap, self.poll_s, self.max_poll_s = cap, poll_s, max(poll_s, max_poll_s)
        self._waiters: list[asyncio.Future] = []
        self._releases: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    async def acquire(self) -> str:
        """Wait for a lease; returns its token."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._settle())
        fut = loop.create_future()
        self._waiters.append(fut)
        self._wake.set()
        return await fut

    def release(self, token: str) -> None:
        """Give a lease back: straight to a request of this job that waits for one (the lease stays held and
        renewed, no Redis round trip, no gap in the server's batch), else to Redis with the next round trip."""
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():  # not cancelled
                fut.set_result(token)
                return
        self._releases.append(token)
        if self._wake is not None:
            self._wake.set()

    async def aclose(self) -> None:
        """Stop the settling task and return every lease still held (call it when the job's requests are over)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        # the job is over: return every lease it still holds. A lease leaves the held set only once Redis took it
        # back, so this covers a cancelled exchange that never ran (it was still queued for a thread)
        rel, self._releases = self.cap.held(), []
        if rel:
            try:
                await asyncio.to_thread(self.cap.exchange, rel, 0)
            except redis.RedisError:
                pass  # the leases expire by themselves within lease_s

    async def _settle(self) -> None:
        delay, full = self.poll_s, False
        while True:
            if full:  # the cap was full: poll again after ``delay`` unless a release or a new request comes first
                # (a timer, not asyncio.wait_for, which can swallow the task's cancellation before Python 3.12)
                timer = asyncio.get_running_loop().call_later(delay, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
                delay = min(2 * delay, self.max_poll_s)
            else:
                await self._wake.wait()
            self._wake.clear()
            self._waiters = [f for f in self._waiters if not f.done()]  # cancelled requests
            rel, self._releases = self._releases, []
            want = len(self._waiters)
            if not rel and not want:
                full = False
                continue
            try:
                granted = await asyncio.to_thread(self.cap.exchange, rel, want)
            except redis.RedisError as e:
                self._releases = rel + self._releases
                waiters, self._waiters = self._waiters, []
                for f in waiters:
                    if not f.done():
                        f.set_exception(e)
                await asyncio.sleep(self.poll_s)
                continue
            if granted:
                delay = self.poll_s
            for tok in granted:
                while self._waiters and self._waiters[0].done():
                    self._waiters.pop(0)
                if self._waiters:
                    self._waiters.pop(0).set_result(tok)
                else:
                    self._releases.append(tok)  # its request went away meanwhile
            full = len(granted) < want
            if self._releases or (self._waiters and not full):
                self._wake.set()

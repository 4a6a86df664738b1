"""Lease owners are unique per process tree, not ``host:pid``: two "hosts" in their own pid namespaces (same host
name, same pids) never return each other's leases. Real processes under ``unshare``, one real Redis."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import redis
from draftsmith.jobqueue.inflight import InflightCap, owner_id, target_tag

# each "host" is a fresh interpreter as pid 1 of its own pid namespace: the same pid on both
HOST = textwrap.dedent("""
    import os, sys, redis
    from draftsmith.jobqueue.inflight import InflightCap, owner_id
    cap = InflightCap(redis.Redis.from_url(sys.argv[1]), "dstest", 8, target="http://target:8000")
    assert cap.try_acquire() is not None
    print(os.getpid(), owner_id())
""")


def _host(redis_url: str) -> tuple[int, str]:
    out = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "-m", sys.executable, "-c", HOST, redis_url],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    return int(out[0]), out[1]


def test_two_hosts_with_the_same_pid_have_different_owners(redis_url):
    (pid_a, owner_a), (pid_b, owner_b) = _host(redis_url), _host(redis_url)
    assert pid_a == pid_b == 1 and owner_a != owner_b
    r = redis.Redis.from_url(redis_url)
    cap = InflightCap(r, "dstest", 8, target="http://target:8000")
    assert cap.in_flight() == 2
    # host A's worker saw its pid-1 horse die: only A's lease goes back, B's request keeps its own
    assert owner_id(1) not in (owner_a, owner_b)
    prefix = owner_a.split(":")[0]
    tokens = [m.decode() for m in r.zrange(cap.key, 0, -1)]
    assert r.zrem(cap.key, *[t for t in tokens if t.startswith(prefix + ":")]) == 1
    assert cap.in_flight() == 1


def test_caps_are_per_target(redis_url):
    r = redis.Redis.from_url(redis_url)
    a = InflightCap(r, "dstest", 8, target="http://Target-A:8000/v1")
    b = InflightCap(r, "dstest", 8, target="http://user:pw@target-b:8000")
    a.set_cap(1)
    assert a.try_acquire() is not None and a.try_acquire() is None  # A is full at 1
    assert b.cap() == 8 and b.try_acquire() is not None  # B is not held back by A
    assert target_tag("http://Target-A:8000/v1") == "target-a:8000" and "pw" not in b.key
    assert a.in_flight_all_targets() == 2
    # a dead process's leases are found whichever target they were for
    assert InflightCap(r, "dstest", 1).release_owner(__import__("os").getpid()) == 2

"""The serving routes in a real Redis: what the gateway reads is what the canary wrote, and concurrent writers
never store one version twice."""

import threading

import redis
from draftsmith.serving.routes import Routes, read_routes, routes_key, write_routes


def test_routes_round_trip_and_count_their_writes(redis_url):
    client = redis.Redis.from_url(redis_url)
    assert read_routes(client, "ds", "demo") is None
    first = write_routes(client, "ds", "demo", Routes(stable="http://a:8000", stable_drafter="v1"))
    assert first.version == 1
    second = write_routes(client, "ds", "demo", first.model_copy(
        update={"canary": "http://b:8000", "canary_drafter": "v2", "canary_share": 0.25}))
    back = read_routes(client, "ds", "demo")
    assert back == second and back.version == 2 and back.canary_share == 0.25
    assert client.exists(routes_key("ds", "demo")) and read_routes(client, "ds", "other") is None


def test_concurrent_writers_each_get_their_own_version(redis_url):
    versions = []

    def writer(n: int) -> None:
        client = redis.Redis.from_url(redis_url)
        for _ in range(20):
            versions.append(write_routes(client, "ds", "demo", Routes(stable=f"http://h{n}:8000")).version)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(1, 81))

"""rq queues of draftsmith: names, the Redis connection, and the JSON serializer (never pickle).

Jobs carry ids, paths and the resolved settings as JSON; records and features travel through the run folder.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from draftsmith.errors import QueueError

STAGES = ("generate", "extract")


def connect(url: str) -> redis.Redis:
    """A Redis client for ``url``, checked with PING.

    Raises:
        QueueError: Redis does not answer (the message says how to start it).
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise QueueError(
            f"Redis does not answer at {url} ({e})",
            "start one (`redis-server --daemonize yes`, or `make up` on the GPU host) or set redis.url",
        ) from e
    except redis.AuthenticationError as e:
        raise QueueError(f"Redis at {url} refused the password ({e})", "put the right password in redis.url") from e
    return client


def queue_name(prefix: str, stage: str) -> str:
    """rq queue name of a stage (``draftsmith:generate``)."""
    if stage not in STAGES:
        raise QueueError(f"unknown queue {stage!r}", f"use one of: {', '.join(STAGES)}")
    return f"{prefix}:{stage}"


def get_queue(client: redis.Redis, prefix: str, stage: str) -> Queue:
    """The rq queue of a stage, with the JSON serializer."""
    return Queue(queue_name(prefix, stage), connection=client, serializer=JSONSerializer)

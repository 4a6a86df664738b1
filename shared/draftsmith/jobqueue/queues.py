"""rq queues of draftsmith: names, the Redis connection, and the JSON serializer (never pickle).

Jobs carry ids, paths and the resolved settings as JSON; records and features travel through the run folder.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from draftsmith.config import redact_url
from draftsmith.errors import QueueError

STAGES = ("generate", "extract")


def connect(url: str) -> redis.Redis:
    """A Redis client for ``url``, checked with PING.

    Raises:
        QueueError: Redis does not answer (the message says how to start it).
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    shown = redact_url(url)  # the message is printed and logged: never the password
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise QueueError(
            f"Redis does not answer at {shown} ({e})",
            "start one (`redis-server --daemonize yes`, or `make up` on the GPU host) or set redis.url",
        ) from e
    except redis.AuthenticationError as e:
        raise QueueError(f"Redis at {shown} refused the password ({e})", "put the right password in redis.url") from e
    return client


def queue_name(prefix: str, stage: str) -> str:
    """rq queue name of a stage (``draftsmith:generate``)."""
    if stage not in STAGES:
        raise QueueError(f"unknown queue {stage!r}", f"use one of: {', '.join(STAGES)}")
    return f"{prefix}:{stage}"


def get_queue(client: redis.Redis, prefix: str, stage: str) -> Queue:
    """The rq queue of a stage, with the JSON serializer."""
    return Queue(queue_name(prefix, stage), connection=client, serializer=JSONSerializer)


def fetch_job(client: redis.Redis, job_id: str) -> Job | None:
    """The rq job ``job_id``, or None when it does not exist or only a fragment of it is left.

    A fragment happens when Redis loses its data (FLUSHDB, a restart without persistence) while a worker still runs
    the job: the worker's heartbeat re-creates the job hash with only ``status``/``worker_name``/``last_heartbeat``,
    and rq cannot load it. Such a fragment is deleted, so the job can be enqueued again under the same id; the
    worker that still runs it writes through the run folder's locks, which drop duplicate records.
    """
    try:
        return Job.fetch(job_id, connection=client, serializer=JSONSerializer)
    except NoSuchJobError:
        client.delete(Job.key_for(job_id))
        return None

"""rq queue metrics for Prometheus: jobs waiting, running and failed, and workers alive, per draftsmith queue.

The stack's ``queue-exporter`` service runs :func:`run_exporter`. The public ``rq-exporter`` package would fit,
but it requires ``rq<3`` and draftsmith runs rq 3; this is the project's own, reading the same registries and
setting the gauges of :mod:`draftsmith.metrics` (``draftsmith_queue_*``, ``draftsmith_workers_alive``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from rq import Queue, Worker

from draftsmith.jobqueue.queues import STAGES, get_queue
from draftsmith.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class QueueStats:
    """One scrape of one rq queue: counts of jobs (waiting, started, failed) and of workers listening on it."""

    queue: str
    waiting: int
    started: int
    failed: int
    workers: int


def queue_stats(q: Queue) -> QueueStats:
    """Read the counts of ``q`` from Redis (``Queue.count``, the started and failed registries, ``Worker.count``)."""
    return QueueStats(
        queue=q.name,
        waiting=q.count,
        started=q.started_job_registry.count,
        failed=q.failed_job_registry.count,
        workers=Worker.count(connection=q.connection, queue=q),
    )


def collect(client: redis.Redis, prefix: str, stages: tuple[str, ...] = STAGES) -> list[QueueStats]:
    """Stats of every draftsmith queue and set the Prometheus gauges from them.

    Args:
        client: a connected Redis client (:func:`draftsmith.jobqueue.queues.connect`).
        prefix: the queue prefix (config ``redis.prefix``); queues are named ``<prefix>:<stage>``.
        stages: the stages to report.

    Returns:
        One :class:`QueueStats` per stage, in the order of ``stages``.
    """
    from draftsmith import metrics

    out = []
    for stage in stages:
        s = queue_stats(get_queue(client, prefix, stage))
        metrics.QUEUE_DEPTH.labels(queue=s.queue).set(s.waiting)
        metrics.QUEUE_STARTED.labels(queue=s.queue).set(s.started)
        metrics.QUEUE_FAILED.labels(queue=s.queue).set(s.failed)
        metrics.WORKERS_ALIVE.labels(queue=s.queue).set(s.workers)
        out.append(s)
    return out


def run_exporter(client: redis.Redis, prefix: str, port: int, interval_s: float, once: bool = False,
                 addr: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on ``addr:port`` and refresh the queue gauges every ``interval_s`` seconds until stopped.

    A Redis error is logged and retried at the next interval (the gauges keep their last values), so a Redis
    restart does not kill the exporter.

    Raises:
        DraftsmithError: the port is taken.
    """
    from draftsmith.metrics import serve_metrics

    serve_metrics(port, addr)
    log.info("queue exporter: /metrics on port %d, every %.1f s, queues %s:{%s}", port, interval_s, prefix,
             ",".join(STAGES))
    while True:
        try:
            stats = collect(client, prefix)
            log.debug("queues: %s", stats)
        except redis.RedisError as e:
            log.warning("queue exporter: Redis error, retrying in %.1f s: %s", interval_s, e)
        if once:
            return
        time.sleep(interval_s)

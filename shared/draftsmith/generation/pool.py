"""The worker pool: rq's ``WorkerPool`` over draftsmith's queues, plus ``/metrics`` and queue gauges.

Metrics across forks: the pool sets ``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client is imported, so every
worker and work-horse writes its samples to that folder and the pool's ``/metrics`` sums them
(``MultiProcessCollector``). A work-horse marks itself dead when its job ends so live gauges drop its values.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from draftsmith.config import Settings
from draftsmith.log import get_logger

log = get_logger(__name__)


def _queue_gauges(s: Settings, stages: list[str], stop: threading.Event, every_s: float = 5.0) -> None:
    from rq import Worker
    from rq.registry import FailedJobRegistry, StartedJobRegistry

    from draftsmith import metrics as M
    from draftsmith.queues import connect, get_queue

    client = connect(s.redis.url)
    while not stop.is_set():
        try:
            for st in stages:
                q = get_queue(client, s.redis.prefix, st)
                M.QUEUE_DEPTH.labels(q.name).set(q.count)
                M.QUEUE_STARTED.labels(q.name).set(StartedJobRegistry(queue=q).count)
                M.QUEUE_FAILED.labels(q.name).set(FailedJobRegistry(queue=q).count)
                M.WORKERS_ALIVE.labels(q.name).set(Worker.count(queue=q))
        except Exception as e:  # keep the gauges thread alive across Redis hiccups
            log.warning("queue gauges: %s", e)
        stop.wait(every_s)


def run_pool(s: Settings, stages: list[str], processes: int, burst: bool = False,
             metrics_port: int | None = None) -> None:
    """Run ``processes`` rq workers on the queues of ``stages`` until stopped (or, with ``burst``, until empty).

    Raises:
        QueueError: Redis does not answer.
    """
    mp_dir = s.metrics.multiproc_dir or Path(tempfile.mkdtemp(prefix="draftsmith-metrics-"))
    from draftsmith.metrics import prepare_multiprocess_dir

    prepare_multiprocess_dir(Path(mp_dir))
    from rq.serializers import JSONSerializer
    from rq.worker_pool import WorkerPool

    from draftsmith.generation.inflight import InflightCap
    from draftsmith.metrics import serve_metrics
    from draftsmith.queues import connect, get_queue

    client = connect(s.redis.url)
    InflightCap(client, s.redis.prefix, s.generation.concurrency, 0).set_cap(s.generation.concurrency)
    port = s.metrics.port if metrics_port is None else metrics_port
    serve_metrics(port)
    stop = threading.Event()
    threading.Thread(target=_queue_gauges, args=(s, stages, stop), daemon=True, name="queue-gauges").start()
    queues = [get_queue(client, s.redis.prefix, st) for st in stages]
    log.info("worker pool: %d process(es) on %s, in-flight cap %d, /metrics on :%s (pid %d)", processes,
             ", ".join(q.name for q in queues), s.generation.concurrency, port or "off", os.getpid())
    pool = WorkerPool(queues, connection=client, num_workers=processes, serializer=JSONSerializer)
    t0 = time.time()
    try:
        pool.start(burst=burst, logging_level=s.log_level)
    finally:
        stop.set()
    log.info("worker pool stopped after %.0f s", time.time() - t0)

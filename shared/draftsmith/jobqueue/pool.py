"""The worker pool: rq's ``WorkerPool`` of :class:`~draftsmith.jobqueue.worker.DraftsmithWorker` over draftsmith's
queues, plus ``/metrics``.

Metrics across forks: the pool sets ``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client is imported, so every
worker and work-horse writes its samples to that folder and the pool's ``/metrics`` sums them
(``MultiProcessCollector``). The pool process itself writes no metric from a thread: the queue gauges are read from
Redis at scrape time (:class:`QueueCollector`), and the value lock is never held across a fork
(:func:`draftsmith.metrics.prepare_multiprocess_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import redis
from rq.worker_pool import WorkerPool

from draftsmith.config import Settings
from draftsmith.errors import DiskSpaceError, StorageError
from draftsmith.jobqueue.exporter import queue_stats
from draftsmith.jobqueue.hooks import run_at_pool_start
from draftsmith.jobqueue.inflight import InflightCap
from draftsmith.jobqueue.queues import connect, get_queue
from draftsmith.jobqueue.worker import DISK_FULL_EXIT, NO_RUN_FOLDER_EXIT, DraftsmithWorker, ResidentWorker
from draftsmith.log import get_logger

log = get_logger(__name__)


class QueueCollector:
    """Prometheus collector of the queue gauges (``draftsmith_queue_*``, ``draftsmith_workers_alive``), read from
    Redis at every scrape; a Redis error yields no queue samples for that scrape (and a warning)."""

    def __init__(self, client, prefix: str, stages: list[str]) -> None:
        self.client, self.prefix, self.stages = client, prefix, stages

    def collect(self):
        """Yield one gauge family per queue metric with one sample per stage."""
        from prometheus_client.core import GaugeMetricFamily

        from draftsmith import metrics as M
        fams = {k: GaugeMetricFamily(g._name, g._documentation, labels=["queue"]) for k, g in (
            ("waiting", M.QUEUE_DEPTH), ("started", M.QUEUE_STARTED), ("failed", M.QUEUE_FAILED),
            ("workers", M.WORKERS_ALIVE))}
        try:
            for st in self.stages:
                q = queue_stats(get_queue(self.client, self.prefix, st))
                for k, fam in fams.items():
                    fam.add_metric([q.queue], getattr(q, k))
        except Exception as e:  # a scrape during a Redis hiccup
            log.warning("queue gauges: %s", e)
            return
        yield from fams.values()


class DraftsmithPool(WorkerPool):
    """rq's pool that stops as a whole when one of its workers stopped for a full disk."""

    disk_full = False
    no_run_folder = False
    compact_every_s = 10.0
    _compacted_at = 0.0
    # A worker can miss its stop signal: one that arrives while the worker is still starting (before rq's handlers
    # are in place, or inside a library call that swallows the exception) left an idle worker running and its pool
    # waiting for it forever (a CI run under load). A stopped pool repeats the signal to every live worker that is
    # not busy; a busy one keeps its warm stop (it finishes its job first).
    restop_every_s = 5.0
    _stop_sent_at: float | None = None

    def stop_workers(self) -> None:
        """rq's stop (SIGINT to every worker); remembers when, so that a missed signal is sent again."""
        self._stop_sent_at = time.monotonic()
        super().stop_workers()

    def all_workers_have_stopped(self) -> bool:
        """rq's check; while workers remain, every ``restop_every_s`` SIGINT again each one that is not busy."""
        if super().all_workers_have_stopped():
            return True
        if self._stop_sent_at is not None and time.monotonic() - self._stop_sent_at >= self.restop_every_s:
            self._stop_sent_at = time.monotonic()
            for data in list(self.worker_dict.values()):
                if not self._busy(data.name):
                    self.log.info("worker %s (pid %d) is still running and not busy: stop signal sent again",
                             data.name, data.pid)
                    self.stop_worker(data)
        return False

    def _busy(self, name: str) -> bool:
        """Whether worker ``name`` says in Redis that it runs a job (unknown -> not busy)."""
        try:
            state = self.connection.hget(self.worker_class.redis_worker_namespace_prefix + name, "state")
        except redis.RedisError:
            return True  # cannot tell: keep the warm stop
        return state in (b"busy", "busy")

    def check_workers(self, respawn: bool = True) -> None:
        """rq's check, then (every ``compact_every_s``) fold dead processes' metric files into the archives."""
        super().check_workers(respawn=respawn)
        from draftsmith import metrics as M

        if M.multiprocess_enabled() and time.monotonic() - self._compacted_at >= self.compact_every_s:
            self._compacted_at = time.monotonic()
            try:
                M.compact_dead_files(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
            except (OSError, ValueError) as e:
                log.warning("metrics compaction: %s", e)

    def handle_dead_worker(self, worker_data) -> None:
        """rq's bookkeeping, plus: drop the dead worker's live metrics; stop the pool after a full disk."""
        from draftsmith import metrics as M
        super().handle_dead_worker(worker_data)
        if M.multiprocess_enabled():
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(worker_data.pid)
        code = worker_data.process.exitcode
        if code in (DISK_FULL_EXIT, NO_RUN_FOLDER_EXIT) and not (self.disk_full or self.no_run_folder):
            self.disk_full, self.no_run_folder = code == DISK_FULL_EXIT, code == NO_RUN_FOLDER_EXIT
            self.status = self.Status.STOPPED
            self.stop_workers()


def metrics_dir(s: Settings) -> tuple[Path, bool]:
    """The pool's multiprocess metrics folder and whether the pool owns it (then removes it when it stops)."""
    if s.metrics.multiproc_dir:
        return Path(s.metrics.multiproc_dir), False
    return Path(tempfile.mkdtemp(prefix="draftsmith-metrics-")), True


def default_processes(s: Settings, stages: list[str]) -> int:
    """Worker processes a pool needs so its requests in flight stay at ``generation.concurrency``: each process runs
    one job of ``batch_size`` prompts at a time, so ``ceil(concurrency / batch_size)`` reach the cap, plus one whose
    job waits for leases and takes over the slots of a job that is finishing its last, slowest requests (the
    shared cap stays the one limit). 1 for a pool without the generate queue."""
    if "generate" not in stages:
        return 1
    return max(1, -(-s.generation.concurrency // s.generation.batch_size)) + 1


def worker_class(stages: list[str]):
    """The worker class for a pool over ``stages``: resident (jobs run in the worker process, so the extraction
    target is loaded once per worker) for a pool that only extracts; forking (a work-horse per job) otherwise."""
    return ResidentWorker if set(stages) == {"extract"} else DraftsmithWorker


def stop_pool_workers(pool: WorkerPool, timeout_s: float = 30.0) -> None:
    """SIGINT every worker of ``pool`` (rq's warm stop) and wait for them; SIGKILL what is left after
    ``timeout_s``."""
    pool.stop_workers()
    deadline = time.monotonic() + timeout_s
    for data in list(pool.worker_dict.values()):
        data.process.join(max(0.0, deadline - time.monotonic()))
        if data.process.is_alive():
            data.process.kill()
            data.process.join(5.0)


def run_pool(s: Settings, stages: list[str], processes: int | None, burst: bool = False,
             metrics_port: int | None = None, metrics_addr: str | None = None) -> None:
    """Run ``processes`` rq workers on the queues of ``stages`` until stopped (or, with ``burst``, until empty).

    A pool serving ``generate`` sets that stage's in-flight cap from ``generation.concurrency``; a pool serving
    only other stages leaves it alone.

    Raises:
        QueueError: Redis does not answer.
        DiskSpaceError: a worker found the disk of a run full; the pool stopped (finished shards are kept).
    """
    if not processes:
        processes = default_processes(s, stages)
    mp_dir, owned = metrics_dir(s)
    from draftsmith.metrics import prepare_multiprocess_dir

    prepare_multiprocess_dir(mp_dir)
    from rq.serializers import JSONSerializer

    from draftsmith.metrics import serve_metrics

    run_at_pool_start()  # the stages' imports and warm-ups, done once here and inherited by every fork (hooks.py)
    client = connect(s.redis.url)
    if "generate" in stages:
        # the pool's own target (DRAFTSMITH_TARGET__URL in its environment), which its jobs talk to
        InflightCap(client, s.redis.prefix, s.generation.concurrency, stage="generate", target=s.target.url).set_cap(
            s.generation.concurrency)
    port = s.metrics.port if metrics_port is None else metrics_port
    metrics_addr = metrics_addr or s.metrics.addr
    serve_metrics(port, addr=metrics_addr, extra=[QueueCollector(client, s.redis.prefix, stages)])
    queues = [get_queue(client, s.redis.prefix, st) for st in stages]
    log.info("worker pool: %d %s process(es) on %s, in-flight cap %s, /metrics on %s (pid %d)", processes,
             "resident" if not worker_class(stages).forks else "forking", ", ".join(q.name for q in queues),
             s.generation.concurrency if "generate" in stages else "-",
             f"{metrics_addr}:{port}" if port else "off", os.getpid())
    if "extract" in stages and worker_class(stages).forks:
        log.warning("extraction in a pool that also serves %s loads the target once per shard (forked "
                    "work-horses); run `draftsmith worker --queues extract` on its own to load it once",
                    ", ".join(st for st in stages if st != "extract"))
    pool = DraftsmithPool(queues, connection=client, num_workers=processes, serializer=JSONSerializer,
                          worker_class=worker_class(stages))
    t0 = time.time()
    try:
        pool.start(burst=burst, logging_level=s.log_level)
    except BaseException:  # a signal before rq's own handlers were in place: no worker may outlive the pool
        stop_pool_workers(pool)
        raise
    finally:
        if owned:
            shutil.rmtree(mp_dir, ignore_errors=True)
    log.info("worker pool stopped after %.0f s", time.time() - t0)
    if pool.no_run_folder:
        raise StorageError(f"a job's run folder under {s.runs_dir} is not on this host and the pool stopped",
                           "mount the same runs/ at the same absolute path on every worker host, or put the run on "
                           "an object store (runs_dir=s3://bucket/runs); the job is back in the queue")
    if pool.disk_full:
        raise DiskSpaceError(f"a worker found the disk under {s.runs_dir} full and the pool stopped",
                             "free some space, then start the worker again; finished shards are kept")

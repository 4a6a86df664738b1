"""draftsmith's rq worker: rq's forking ``Worker`` plus the clean-up of what a dead process leaves behind.

- The scheduler child (rq forks one per worker that wins the scheduler lock) dies with its worker: it asks the
  kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and checks its parent at every heartbeat, then
  releases the lock. Without this a SIGKILLed worker left its scheduler running under PID 1.
- A work-horse that dies without cleaning up (SIGKILL, OOM) has its in-flight leases returned and its live
  metric values dropped by the worker that forked it, at once; a work-horse whose worker dies dies with it.
- A full disk under a job's run folder stops the worker taking work: the job goes back to the front of its queue,
  one line says what to do, and the worker exits (the pool then stops; the run stays resumable).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import signal
from pathlib import Path

from rq.scheduler import RQScheduler
from rq.worker import SimpleWorker, Worker

from draftsmith.artifacts.storage import check_disk, reachable_here
from draftsmith.config import load_settings
from draftsmith.errors import DiskSpaceError, DraftsmithError, StorageError, TransientFailures
from draftsmith.jobqueue.hooks import idle_hooks, run_before_job, run_idle_hook
from draftsmith.jobqueue.inflight import InflightCap
from draftsmith.log import get_logger

log = get_logger(__name__)

_PR_SET_PDEATHSIG = 1
DISK_FULL_EXIT = 75  # EX_TEMPFAIL: the worker process stopped because the disk is full
NO_RUN_FOLDER_EXIT = 74  # EX_IOERR: a job's run folder is not on this host (no shared mount, no object store)
MIN_FREE_BYTES = 64 * 1024  # below this a disk counts as full whatever generation.min_free_disk_gb says


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; returns False where that is unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class BoundScheduler(RQScheduler):
    """rq's scheduler, but its process never outlives the worker that started it."""

    _parent_pid = 0

    def start(self):
        """Fork the scheduler process (as rq does) bound to this worker."""
        self._parent_pid = os.getpid()
        return super().start()

    def work(self):
        """The scheduler loop in the child; stops when the parent worker is gone."""
        die_with_parent(signal.SIGTERM)
        if self._parent_pid and os.getppid() != self._parent_pid:
            self.request_stop()  # the parent died between the fork and the prctl
        super().work()

    def heartbeat(self):
        """rq's heartbeat, unless the worker died: then release the lock and stop at once."""
        if self._parent_pid and os.getppid() != self._parent_pid:
            log.warning("scheduler %d: its worker %d is gone; releasing the scheduler lock", os.getpid(),
                        self._parent_pid)
            self.stop()
            os._exit(0)
        super().heartbeat()


# rq's registry maintenance is what hands a dead worker's job back to the queue (its started-job registry for a
# job whose work-horse died with it; its intermediate list, after two passes a minute apart, for a job it had only
# dequeued). rq runs it every 10 minutes, and only between blocking reads of an empty queue (405 s each), so a
# job of a SIGKILLed worker or container waited 10-20 minutes for it (848 s in one run of the Compose stack test);
# every 30 s it costs a few Redis calls per queue, under a lock that lets one worker of the pool do it.
MAINTENANCE_INTERVAL_S = 30


# Longest blocking read of a worker's command channel (rq's: 60 s), which bounds how long a stopping worker waits
# for its channel thread (:meth:`_DraftsmithWork.subscribe`).
PUBSUB_READ_S = 1.0


class _DraftsmithWork:
    """What every draftsmith worker adds to rq's (see the module docstring); mixed into a forking and a resident
    worker class."""

    disk_full: str | None = None
    no_run_folder: str | None = None
    forks = True

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("maintenance_interval", MAINTENANCE_INTERVAL_S)
        super().__init__(*args, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        """Seconds one blocking read of an empty queue waits: at most the maintenance interval, which runs
        between reads (rq's own: ``worker_ttl`` - 15 = 405 s)."""
        return max(1, min(self.worker_ttl - 15, MAINTENANCE_INTERVAL_S))

    def subscribe(self) -> None:
        """rq's command channel (shutdown, stop or kill a job), read in a thread that wakes every
        :data:`PUBSUB_READ_S` instead of rq's 60 s.

        rq 3.0 wakes the blocked read at exit with the reply to its UNSUBSCRIBE; when the thread has already read that
        reply and blocked again, the worker's exit waited out the whole read (a burst pool of the Kimi demo
        stopped 60 s after its last job). A short read bounds that wait for one idle wake-up per second. The body
        is rq 3.0's own but for the read time (``_pubsub_exception_handler`` is rq's private handler);
        tests/lifecycle/test_pool_stop.py fails if rq changes what this relies on.
        """
        log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(sleep_time=PUBSUB_READ_S, daemon=True,
                                                       exception_handler=self._pubsub_exception_handler)

    def _start_scheduler(self, burst: bool = False, logging_level: str | None = "INFO", *args, **kwargs):
        """rq's scheduler start, with :class:`BoundScheduler` (burst workers only enqueue due jobs, in-process)."""
        scheduler = BoundScheduler(self.queues, connection=self.connection, serializer=self.serializer,
                                   logging_level=logging_level if logging_level is not None else self.log.level)
        # A burst worker keeps no scheduler: rq's maintenance (every MAINTENANCE_INTERVAL_S here) starts the
        # worker's scheduler as a process whenever it can take the lock, and in a burst worker that process kept
        # the worker, and `make demo`'s generation, waiting after the last job (every prompt answered).
        self.scheduler = None if burst else scheduler
        scheduler.acquire_locks()
        if not scheduler.acquired_locks:
            return
        if burst:
            try:
                scheduler.register_birth()
                scheduler.enqueue_scheduled_jobs()
            finally:
                scheduler.release_locks()
                scheduler.register_death()
        else:
            scheduler.start()

    def execute_job(self, job, queue):
        """Run ``job`` in a work-horse unless the disk of its run folder is full (then stop taking work)."""
        self._worker_pid = os.getpid()
        try:
            check_job_disk(job)
        except (DiskSpaceError, StorageError) as e:
            self.connection.lrem(queue.intermediate_queue_key, 1, job.id)
            queue.enqueue_job(job, at_front=True)
            if isinstance(e, DiskSpaceError):
                self.disk_full = str(e)
            else:
                self.no_run_folder = str(e)
            log.error("%s; this worker stops taking work (job %s is back in the queue)", e, job.id)
            self._stop_requested = True
            return
        run_before_job(job.kwargs)  # the stage's caches read once here, inherited by the horse (hooks.py)
        if self.forks:
            gc.freeze()  # the horse's collector leaves the inherited heap alone: no copy-on-write of its pages
        super().execute_job(job, queue)
        flag = self.connection.getdel(self._disk_full_key)  # set by the work-horse (see handle_exception)
        if flag:
            self.disk_full = flag.decode()
            requeue_at_front(queue, job)
            log.error("job %s stopped on a full disk; this worker stops taking work (the job is back at the front "
                      "of the queue)", job.id)
            self._stop_requested = True

    @property
    def _disk_full_key(self) -> str:
        return f"rq:worker:{self.name}:draftsmith-disk-full"

    def handle_exception(self, job, *exc_info):
        """A user-facing failure of a job (a full disk, prompts to retry) is one line; anything else keeps rq's
        full report with its traceback. A failure marked ``retryable = False`` (a job refused for its run settings,
        :class:`draftsmith.errors.RunSettingsMismatch`) fails for good at once, whatever retries the job has left."""
        exc = exc_info[1] if len(exc_info) > 1 else None
        if not isinstance(exc, DraftsmithError | TransientFailures):
            return super().handle_exception(job, *exc_info)
        log.error("job %s: %s: %s", job.id, type(exc).__name__, exc)
        if not getattr(exc, "retryable", True):
            job.retries_left = 0  # rq retries on any failure; this one would only repeat (handle_job_failure reads it)
        if isinstance(exc, DiskSpaceError):  # tell the worker (this is its work-horse) to stop taking work
            self.connection.set(self._disk_full_key, str(exc), ex=3600)
        from rq.job_lifecycle import call_exception_handlers

        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def work(self, *args, **kwargs):
        """rq's work loop; exits the process with :data:`DISK_FULL_EXIT` when it stopped for a full disk."""
        result = super().work(*args, **kwargs)
        if self.disk_full:
            raise SystemExit(DISK_FULL_EXIT)
        if self.no_run_folder:
            raise SystemExit(NO_RUN_FOLDER_EXIT)
        return result


class DraftsmithWorker(_DraftsmithWork, Worker):
    """The forking worker of draftsmith's pool: a fresh work-horse per job (generation: a job's memory and
    connections die with it)."""

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        """Return the dead horse's in-flight leases and drop its live metric values, then do rq's part."""
        pid = retpid or self.horse_pid
        if pid:
            release_dead_process(self.connection, job, pid)
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)

    def main_work_horse(self, job, queue):
        """The work-horse's life: rq's, bound to its worker. A horse whose worker was killed would run on unseen
        (no heartbeat names it), while ``enqueue`` rightly requeues the job of a worker that is gone: the horse
        dies with its worker instead, so a job never runs twice at once (and the in-flight leases it held
        expire)."""
        die_with_parent(signal.SIGKILL)
        if getattr(self, "_worker_pid", 0) and os.getppid() != self._worker_pid:
            os._exit(1)  # the worker died between the fork and the prctl
        return super().main_work_horse(job, queue)


class ResidentWorker(_DraftsmithWork, SimpleWorker):
    """A worker that runs its jobs in its own process, one after another (rq's ``SimpleWorker``), so what a job
    loads and caches serves the next: the extraction target is loaded once per worker, not once per shard (a
    forked work-horse took its cache to the grave with it: 5 shards, 5 loads; for a 600 GB target each load is
    many minutes). A killed resident worker loses only the job it was running; the pool starts another, which
    loads the target once.

    rq's resident worker sends no heartbeat while a job runs (the forking one does, from its monitoring loop), so
    a job longer than the liveness grace would look abandoned (:mod:`draftsmith.jobqueue.liveness`); a thread
    here beats every ``job_monitoring_interval`` while a job runs.
    """

    forks = False

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """rq's wait for the next job, running the stages' idle hooks (:func:`draftsmith.jobqueue.hooks.when_idle`)
        once each when the queues have been empty that long: the extraction stage frees the target there."""
        import math
        import time

        pending = idle_hooks()
        if timeout is None or not pending:  # a burst worker ends on an empty queue: nothing to free early
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        t0 = time.monotonic()
        while True:
            idle = time.monotonic() - t0
            waits = [pending[0][0] - idle] if pending else []
            if max_idle_time is not None:
                waits.append(max_idle_time - idle)
            step = max(1, math.ceil(min(waits))) if waits else None  # rq counts idle time in whole seconds
            result = super().dequeue_job_and_maintain_ttl(timeout, step)
            if result is not None:
                return result
            idle = time.monotonic() - t0
            if max_idle_time is not None and idle >= max_idle_time:
                return None
            while pending and idle >= pending[0][0]:
                run_idle_hook(pending.pop(0)[1], idle)

    def execute_job(self, job, queue):
        """Run ``job`` here, heartbeating from a thread until it ends."""
        import threading

        import redis

        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.job_monitoring_interval):
                try:
                    self.heartbeat(self.job_monitoring_interval + 60)
                except redis.RedisError as e:  # Redis away: the next beat tries again
                    log.warning("worker %s: heartbeat not sent (%s)", self.name, e)

        t = threading.Thread(target=beat, name="draftsmith-heartbeat", daemon=True)
        t.start()
        try:
            super().execute_job(job, queue)
        finally:
            stop.set()
            t.join()


def requeue_at_front(queue, job) -> None:
    """Put ``job`` back at the front of ``queue`` wherever rq moved it after the failure (a retry scheduled for
    later, the failed registry, or the back of the queue): a full disk is not the job's fault, so the next worker
    that starts runs it first instead of waiting for a retry delay (a burst worker would otherwise quit before it)."""
    from rq.registry import FailedJobRegistry, ScheduledJobRegistry

    for registry in (ScheduledJobRegistry(queue=queue), FailedJobRegistry(queue=queue)):
        registry.remove(job)
    queue.remove(job)
    queue.enqueue_job(job, at_front=True)


@functools.cache
def own_min_free_gb() -> float:
    """This worker's ``generation.min_free_disk_gb``: a host setting, from the worker's own environment (a job
    carries only the run's settings); read once, the environment does not change under a running worker."""
    return load_settings().generation.min_free_disk_gb


def check_job_disk(job) -> None:
    """Raises DiskSpaceError when a generation job's run folder has less than this worker's
    ``generation.min_free_disk_gb`` free, and StorageError when its local run folder does not exist on this host (a
    worker on a machine without the run's mount: it would only fail every job). A run on an object store is not
    checked here."""
    kw = job.kwargs or {}
    root = kw.get("run_root")
    if not root:
        return
    if not reachable_here(root):
        raise StorageError(f"the run folder {root} of job {job.id} is not on this host",
                           "mount the same runs/ at the same absolute path on every worker host, or put the run "
                           "on an object store (runs_dir=s3://bucket/runs) that every host reaches")

    check_disk(Path(root), max(own_min_free_gb(), MIN_FREE_BYTES / 1e9), mkdir=False)


def release_dead_process(connection, job, pid: int) -> None:
    """Return the leases of dead process ``pid`` and mark it dead for the multiprocess metrics."""
    from draftsmith import metrics as M
    prefix = (job.origin or "").rsplit(":", 1)[0] or "draftsmith"  # its queue is ``<redis.prefix>:<stage>``
    try:
        n = InflightCap(connection, prefix, 1).release_owner(pid)
        if n:
            log.warning("work-horse %d died holding %d in-flight lease(s); returned them", pid, n)
    except Exception as e:  # Redis away: the leases expire by themselves within their lease time
        log.warning("could not return the leases of dead work-horse %d: %s", pid, e)
    if M.multiprocess_enabled():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)

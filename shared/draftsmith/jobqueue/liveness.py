"""Whether an rq job is really alive, and handing back the ones that are not.

rq records a job's state, not whether anyone is still working on it. A worker killed right after it dequeued a job
leaves that job on the queue's intermediate list with status ``queued``; one killed while its work-horse ran leaves
it ``started`` in the started-job registry. rq's maintenance hands both back, but only minutes later, and meanwhile
a job id that still exists looked "queued" or "running" to ``enqueue`` and ``status``.

:func:`census` looks past the status: a job counts as running only while the worker named on it sends heartbeats
(rq's worker heartbeat: every ``job_monitoring_interval`` = 30 s while a work-horse runs, every blocking read of an
empty queue otherwise), and a dequeued job that no worker started within :data:`DEQUEUE_GRACE_S` is orphaned.
:func:`requeue_orphan` puts an orphaned job back at the front of its queue with its own id and arguments.

rq's public API, plus two parts of rq 3 that its own maintenance uses for the same question: the intermediate
list's first-seen marks (``Queue.intermediate_queue``) and the executions of the started registry
(``rq.executions.Execution``, which name the worker); ``tests/generation/test_resume_liveness.py`` fails if rq
changes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from rq.executions import Execution
from rq.job import JobStatus
from rq.registry import DeferredJobRegistry, FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import Worker

from draftsmith.jobqueue.queues import fetch_job

# A live worker heartbeats at least every 30 s (rq's job_monitoring_interval while a horse runs, and draftsmith's
# dequeue timeout while idle); two missed beats and a margin for a busy host mean it is gone.
HEARTBEAT_GRACE_S = 75.0
# A live worker starts the job it dequeued within milliseconds (a disk check and the run caches in between).
DEQUEUE_GRACE_S = 10.0


class JobState(StrEnum):
    """Where a job really is: ``waiting`` (in its queue, or deferred), ``running`` (a live worker holds it),
    ``dequeued`` (taken off the queue moments ago, not started yet), ``retry`` (a failed attempt, scheduled to run
    again), ``failed`` (failed for good), ``orphaned`` (held by a worker that is gone: nothing will run it until it
    is requeued), ``finished``."""

    WAITING = "waiting"
    RUNNING = "running"
    DEQUEUED = "dequeued"
    RETRY = "retry"
    FAILED = "failed"
    ORPHANED = "orphaned"
    FINISHED = "finished"


ALIVE = frozenset({JobState.WAITING, JobState.RUNNING, JobState.DEQUEUED, JobState.RETRY})


@dataclass
class Census:
    """Every job of one queue that rq still holds, by :class:`JobState` (``jobs`` maps job id to (state, job))."""

    jobs: dict[str, tuple[JobState, object]] = field(default_factory=dict)

    def of(self, state: JobState) -> list:
        """The jobs in ``state``."""
        return [job for st, job in self.jobs.values() if st is state]


def _age_s(when, now: float) -> float:
    return now - when.timestamp() if when is not None else float("inf")


def live_workers(queue, now: float | None = None) -> set[str]:
    """Names of the workers on ``queue`` whose last heartbeat is younger than :data:`HEARTBEAT_GRACE_S`."""
    now = time.time() if now is None else now
    return {w.name for w in Worker.all(queue=queue)
            if _age_s(w.last_heartbeat, now) < HEARTBEAT_GRACE_S}


def census(queue, keep=None, now: float | None = None) -> Census:
    """Classify every job that ``queue`` holds (queue list, intermediate list, started, scheduled, deferred and
    failed registries) by where it really is.

    Args:
        queue: an rq ``Queue`` (JSON serializer, as draftsmith's queues are).
        keep: optional predicate on a job; jobs it rejects (another run's) are left out.
        now: epoch seconds (tests).

    Returns:
        :class:`Census`.

    Raises:
        redis.RedisError: Redis stopped answering.
    """
    now = time.time() if now is None else now
    conn = queue.connection
    regs = {name: cls(queue.name, connection=conn, serializer=JSONSerializer) for name, cls in (
        ("started", StartedJobRegistry), ("scheduled", ScheduledJobRegistry), ("deferred", DeferredJobRegistry),
        ("failed", FailedJobRegistry))}
    waiting = set(queue.get_job_ids())
    dequeued = set(queue.intermediate_queue.get_job_ids())
    held = {name: set(reg.get_job_ids(cleanup=False)) for name, reg in regs.items()}
    runners: dict[str, set[str]] = {}  # job id -> workers named by its executions (rq writes them first)
    for jid, eid in regs["started"].get_job_and_execution_ids(cleanup=False):
        try:
            runners.setdefault(jid, set()).add(Execution.fetch(eid, jid, conn).worker_name)
        except ValueError:  # the execution's hash expired or was never written
            runners.setdefault(jid, set())
    workers = live_workers(queue, now)
    out = Census()
    for jid in sorted(waiting | dequeued | set().union(*held.values())):
        job = fetch_job(conn, jid)
        if job is None or (keep is not None and not keep(job)):
            continue
        out.jobs[jid] = (_state(queue, job, waiting, held, runners, workers, now), job)
    return out


def _state(queue, job, waiting: set[str], held: dict[str, set[str]], runners: dict[str, set[str]],
           workers: set[str], now: float) -> JobState:
    status = job.get_status(refresh=False)
    if status == JobStatus.FINISHED:
        return JobState.FINISHED
    if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED) or job.id in held["failed"]:
        return JobState.FAILED
    if status == JobStatus.SCHEDULED or job.id in held["scheduled"]:
        return JobState.RETRY
    if job.id in waiting or status == JobStatus.DEFERRED:
        return JobState.WAITING
    named = runners.get(job.id, set()) | ({job.worker_name} if job.worker_name else set())
    named.discard("")
    if named:
        return JobState.RUNNING if named & workers else JobState.ORPHANED
    # dequeued (the intermediate list) and not started by a named worker: a worker died in between, or is about to
    # start it (rq adds the started-registry entry a moment before it names the worker on the job)
    iq = queue.intermediate_queue
    iq.set_first_seen(job.id)
    return JobState.ORPHANED if _age_s(iq.get_first_seen(job.id), now) >= DEQUEUE_GRACE_S else JobState.DEQUEUED


def settle(queue, keep=None, wait_s: float = DEQUEUE_GRACE_S + 1.0, sleep=time.sleep) -> Census:
    """:func:`census`, again after ``wait_s`` if some job was only just dequeued, so that every job is known to be
    alive or orphaned (a resume must not skip a dead worker's job, nor requeue one a live worker is starting)."""
    c = census(queue, keep)
    if c.of(JobState.DEQUEUED):
        sleep(wait_s)
        c = census(queue, keep)
    return c


def requeue_orphan(queue, job) -> None:
    """Put an orphaned ``job`` back at the front of ``queue``: off the intermediate list and the started registry,
    status ``queued``, same id and arguments. A worker that was only slow, not dead, and still finishes it does no
    harm: draftsmith's record store keeps the first record of a prompt and drops the other."""
    conn = queue.connection
    iq = queue.intermediate_queue
    iq.remove(job.id)
    conn.delete(iq.get_first_seen_key(job.id))
    # the registry's entries of this job, by their own keys: the executions' hashes may have expired with their
    # worker (rq's `remove_executions` reads them first and raises "Execution ... not found")
    started = StartedJobRegistry(queue.name, connection=conn, serializer=JSONSerializer)
    entries = [f"{jid}:{eid}" for jid, eid in started.get_job_and_execution_ids(cleanup=False) if jid == job.id]
    if entries:
        conn.zrem(started.key, *entries)
    queue.enqueue_job(job, at_front=True)


"""Enqueue extraction jobs on the rq queue ``<redis.prefix>:extract`` (JSON serializer; ids, paths and the run's
settings only).

A job says what: the run's keys of the config (:func:`draftsmith.config.run_settings`: layers, stored dtype, ...),
recorded with the run (:mod:`draftsmith.artifacts.run_settings`). The extraction service says how: backend, device,
tensor/expert parallel, batch budget and paths come from the worker's own environment.
"""

from __future__ import annotations

from draftsmith.artifacts.run_settings import record
from draftsmith.config import run_settings
from draftsmith.jobqueue.liveness import ALIVE, JobState, requeue_orphan, settle
from draftsmith.jobqueue.queues import connect, fetch_job, queue_name
from draftsmith.log import get_logger

log = get_logger(__name__)

JOB_FUNC = "draftsmith.features.jobs.extract_job"  # a local run or one on an object store: its store says how
RUN_SECTIONS = ("extract",)  # the sections of the run's settings an extraction job uses, recorded and checked


def job_id(run: str, shard: int) -> str:
    """Stable job id of one shard: re-running ``extract`` does not enqueue a shard that is queued or running."""
    return f"extract-{run}-{shard:05d}"


def enqueue_shards(settings, run_dir: str, shards: list[int]) -> list[str]:
    """Enqueue one :func:`draftsmith.features.jobs.extract_job` per shard.

    Args:
        settings: :class:`draftsmith.config.Settings` of the enqueuing command: its run keys go into each job
            (:func:`draftsmith.config.run_settings`) and into the run's record; its host keys stay here.
        run_dir: ``runs/<run>``: a path, or the run's URL on an object store.
        shards: data shard indices to extract.

    Returns:
        Ids of the jobs enqueued now, requeued ones included (a job held by a worker that is gone is requeued
        at once, :mod:`draftsmith.jobqueue.liveness`; shards whose job is alive are left alone).

    Raises:
        QueueError: Redis does not answer at ``redis.url``.
    """
    from rq import Queue
    from rq.serializers import JSONSerializer

    conn = connect(settings.redis.url)
    q = Queue(queue_name(settings.redis.prefix, "extract"), connection=conn, serializer=JSONSerializer)
    dumped = run_settings(settings)
    if changed := record(run_dir, dumped, RUN_SECTIONS):
        log.warning(
            "the run's settings change (%s): jobs still queued with the old values will be refused",
            "; ".join(changed),
        )
    wanted = {job_id(settings.run, shard) for shard in shards}
    jobs = settle(q, keep=lambda job: job.id in wanted)
    ids = []
    for shard in shards:
        jid = job_id(settings.run, shard)
        state, old = jobs.jobs.get(jid, (None, None))
        if state is JobState.ORPHANED:  # its worker was killed holding it: back to the front, at once
            requeue_orphan(q, old)
            log.warning("shard %05d: job %s was held by a worker that is gone; requeued", shard, jid)
            ids.append(jid)
            continue
        if state in ALIVE:
            log.info("shard %05d already %s as job %s", shard, state.value, jid)
            continue
        old = fetch_job(conn, jid)
        if old is not None:
            old.delete()  # finished or failed for good: the shard's sidecar says whether it is done
        q.enqueue(
            JOB_FUNC,
            args=(run_dir, shard, dumped),
            job_id=jid,
            job_timeout=settings.extract.job_timeout_s,
            result_ttl=7 * 86400,
            failure_ttl=7 * 86400,
            description=f"extract {settings.run} shard {shard}",
        )
        ids.append(jid)
    log.info("enqueued %d extraction jobs on %s", len(ids), q.name)
    return ids

"""Enqueue extraction jobs on the rq queue ``<redis.prefix>:extract`` (JSON serializer; ids and paths only)."""

from __future__ import annotations

from draftsmith.log import get_logger

log = get_logger(__name__)

JOB_FUNC = "draftsmith.features.jobs.extract_job"


def job_id(run: str, shard: int) -> str:
    """Stable job id of one shard: re-running ``extract`` does not enqueue a shard that is queued or running."""
    return f"extract-{run}-{shard:05d}"


def enqueue_shards(settings, run_dir: str, shards: list[int]) -> list[str]:
    """Enqueue one :func:`draftsmith.features.jobs.extract_job` per shard.

    Args:
        settings: :class:`draftsmith.config.Settings` (dumped to JSON into each job).
        run_dir: ``runs/<run>``.
        shards: data shard indices to extract.

    Returns:
        Ids of the jobs enqueued now (shards already queued or running are left alone).

    Raises:
        QueueError: Redis does not answer at ``redis.url``.
    """
    from rq import Queue
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from draftsmith.jobqueue.queues import connect, fetch_job, queue_name

    conn = connect(settings.redis.url)
    q = Queue(queue_name(settings.redis.prefix, "extract"), connection=conn, serializer=JSONSerializer)
    dumped = settings.model_dump(mode="json")
    ids = []
    for shard in shards:
        jid = job_id(settings.run, shard)
        old = fetch_job(conn, jid)
        if old is not None:
            if old.get_status() in (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
                log.info("shard %05d already %s as job %s", shard, old.get_status(), jid)
                continue
            old.delete()
        q.enqueue(JOB_FUNC, args=(run_dir, shard, dumped), job_id=jid,
                  job_timeout=settings.extract.job_timeout_s, result_ttl=7 * 86400, failure_ttl=7 * 86400,
                  description=f"extract {settings.run} shard {shard}")
        ids.append(jid)
    log.info("enqueued %d extraction jobs on %s", len(ids), q.name)
    return ids

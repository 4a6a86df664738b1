"""The tail of a generation run: prompts whose answer outlived ``generation.handoff_after_s`` in a batch job.

A batch job cancels such a request and hands its prompt id to the run's tail list (a Redis list,
``<prefix>:tail:<run folder>``), so the job ends with its other answers and frees its worker process instead of
holding it (and its finished requests' slots) for one long answer. The ids on the list are run together as *tail
jobs* of up to ``batch_size`` prompts, which never hand off again: a tail job is enqueued when the list holds a
whole batch, or when a job ends and the generate queue has nothing waiting (the run's stragglers, gathered). One
long answer then costs one request slot for its length, not a whole job's process.

Nothing is lost or done twice. The hand-off writes the id into the handing job's rq ``meta`` and onto the list in
one transaction, so a retry of that job (rq's Retry, or ``enqueue`` requeueing it after its worker died) skips the
id. Ids are taken off the list with one atomic ``LPOP`` (count), so two jobs never take the same id. A process
killed between that pop and the tail job's enqueue leaves the ids in no job: disk is the truth, and
``draftsmith enqueue`` (resume) gives every prompt without a record and in no live job or tail list a new job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from rq import Retry

from draftsmith.artifacts.location import run_key, run_location
from draftsmith.generation.job_ids import JOB_FUNC, RESULT_TTL_S, job_id_for
from draftsmith.jobqueue.queues import fetch_job


def tail_key(prefix: str, run_root: Path | str) -> str:
    """Redis key of a run's tail list (the run folder identifies the run, as for its progress hash)."""
    return f"{prefix}:tail:{run_key(run_root)}"


def tail_ids(client: redis.Redis, prefix: str, run_root: Path | str) -> set[str]:
    """The prompt ids waiting on the run's tail list (handed off, in no tail job yet).

    Raises:
        redis.RedisError: Redis does not answer.
    """
    return {i.decode() for i in client.lrange(tail_key(prefix, run_root), 0, -1)}


def hand_off(client: redis.Redis, prefix: str, run_root: Path | str, prompt_id: str, job=None) -> None:
    """Put ``prompt_id`` on the run's tail list and, in the same transaction, into ``job``'s rq meta
    (``handed_off``), so a retry of ``job`` does not answer it again.

    Raises:
        redis.RedisError: Redis does not answer (nothing was written: the prompt stays the job's own).
    """
    pipe = client.pipeline(transaction=True)
    if job is not None:
        job.meta.setdefault("handed_off", []).append(prompt_id)
        pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))
    pipe.rpush(tail_key(prefix, run_root), prompt_id)
    pipe.execute()


def handed_off(job) -> set[str]:
    """The prompt ids ``job`` (an rq job, or None) handed to the tail in an earlier attempt."""
    if job is None:
        return set()
    return set((job.meta or {}).get("handed_off", []))


def enqueue_tail(queue, run_root: Path | str, prefix: str, batch_size: int, model: str, settings: dict[str, Any],
                 whole_batches_only: bool, *, job_retries: int, job_timeout_s: int) -> list[str]:
    """Move ids from the run's tail list into tail jobs of up to ``batch_size`` prompts; returns their job ids.

    With ``whole_batches_only`` only whole batches are taken (a job calls it this way while other jobs wait in
    the queue: its stragglers wait for company); without it everything on the list goes (the queue is idle, or a
    resume). ``settings`` are the job's run settings (:func:`draftsmith.generation.enqueue.job_settings`);
    ``job_retries`` and ``job_timeout_s`` are the enqueuing host's (``generation.job_retries``, ``job_timeout_s``).

    Raises:
        redis.RedisError: Redis does not answer (ids popped before the error are in no job; a resume finds them).
    """
    client, key = queue.connection, tail_key(prefix, run_root)
    root = run_key(run_root)
    retry = Retry(max=job_retries, interval=[5, 30, 120][:job_retries]) if job_retries > 0 else None
    out: list[str] = []
    while True:
        if whole_batches_only and client.llen(key) < batch_size:
            return out
        ids = [i.decode() for i in (client.lpop(key, batch_size) or [])]
        if not ids:
            return out
        ids = list(dict.fromkeys(ids))  # an id handed off twice (a job retried between hand-off and pop) runs once
        jid = job_id_for(root, ["tail", *ids])
        old = fetch_job(client, jid)
        if old is not None:
            old.delete()  # a finished or failed tail job of the very same prompts: theirs are pending again
        queue.enqueue(
            JOB_FUNC, job_id=jid, retry=retry, job_timeout=job_timeout_s,
            result_ttl=RESULT_TTL_S, failure_ttl=30 * 86400, at_front=True,
            description=f"generate {len(ids)} handed-off prompts for {run_location(root).name}",
            kwargs={"run_root": root, "job_id": jid, "prompt_ids": ids, "model": model, "settings": settings,
                    "tail": True},
        )
        out.append(jid)

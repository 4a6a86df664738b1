"""Job fragments left by a Redis flush under a running worker (seen in CI): they read as "no job", never crash."""

from __future__ import annotations

import redis
from draftsmith.generation.enqueue import active_prompt_ids
from draftsmith.jobqueue.queues import fetch_job, get_queue
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

# The hash a real rq worker's heartbeat wrote after FLUSHDB in CI run 9 (rq cannot load it: no `data` field).
FRAGMENT = {"last_heartbeat": "2026-11-30T09:58:29.576884Z", "status": "started",
            "started_at": "2026-11-30T09:58:29.576884Z", "worker_name": "38f259dc6032421aa763bde757302370"}


def test_fragment_is_no_job_and_is_removed(redis_url):
    conn = redis.Redis.from_url(redis_url)
    conn.hset(Job.key_for("gen-frag"), mapping=FRAGMENT)
    assert fetch_job(conn, "gen-frag") is None
    assert not conn.exists(Job.key_for("gen-frag"))
    assert fetch_job(conn, "gen-never") is None


def test_active_ids_skip_fragments_and_keep_real_jobs(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    q = get_queue(conn, "dstest", "generate")
    q.enqueue("draftsmith.generation.jobs.generate_job", job_id="gen-real",
              kwargs={"run_root": str(tmp_path), "prompt_ids": ["a", "b"]})
    conn.hset(Job.key_for("gen-frag"), mapping=FRAGMENT)
    # rq 3 keys started jobs as `<job id>:<execution id>`
    conn.zadd(StartedJobRegistry(q.name, connection=conn, serializer=JSONSerializer).key, {"gen-frag:e1": 9e12})
    assert active_prompt_ids(q, tmp_path) == {"a", "b"}
    assert fetch_job(conn, "gen-real").kwargs["prompt_ids"] == ["a", "b"]

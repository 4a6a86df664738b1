"""`draftsmith extract` enqueues JSON jobs on a real Redis; a real rq worker runs them."""

from __future__ import annotations

import json

import redis
from draftsmith.features.queue import enqueue_shards, job_id
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer


def test_enqueue_then_rq_worker_extracts(data_run, make_settings, redis_url):
    s = make_settings(data_run)
    s = s.model_copy(update={"redis": s.redis.model_copy(update={"url": redis_url, "prefix": "dstest"})})
    ids = enqueue_shards(s, str(data_run), [0, 1])
    assert ids == [job_id("t", 0), job_id("t", 1)]
    assert enqueue_shards(s, str(data_run), [0, 1]) == []  # already queued: not enqueued twice
    conn = redis.Redis.from_url(redis_url)
    q = Queue("dstest:extract", connection=conn, serializer=JSONSerializer)
    assert q.count == 2
    job = Job.fetch(ids[0], connection=conn, serializer=JSONSerializer)
    assert job.func_name == "draftsmith.features.jobs.extract_job"
    assert job.args[:2] == (str(data_run), 0) or list(job.args[:2]) == [str(data_run), 0]
    json.dumps(job.args)  # ids, paths and settings only: no tensors
    SimpleWorker([q], connection=conn, serializer=JSONSerializer).work(burst=True)
    results = [Job.fetch(i, connection=conn, serializer=JSONSerializer).return_value() for i in ids]
    assert [r["samples"] for r in results] == [3, 2]
    man = json.loads((data_run / "features/manifest.json").read_text())
    assert len(man["shards"]) == 2 and man["samples"] == 5

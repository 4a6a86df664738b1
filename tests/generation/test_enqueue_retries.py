"""``generation.job_retries`` reaches rq as it should, 0 included (rq's ``Retry(max=0)`` raises), against the real
Redis and the real vLLM CPU server."""

from __future__ import annotations

import pytest
from draftsmith.config import load_settings
from draftsmith.generation.enqueue import enqueue
from draftsmith.jobqueue.queues import fetch_job, get_queue

pytestmark = pytest.mark.e2e

GSM8K = "data/prompts/gsm8k_train.jsonl"


def _settings(tmp_path, redis_url, url, retries):
    return load_settings(None, {
        "runs_dir": str(tmp_path / "runs"), "run": "r", "redis": {"url": redis_url, "prefix": "dsretry"},
        "target": {"url": url}, "generation": {"job_retries": retries, "batch_size": 2},
    })


@pytest.mark.parametrize("retries", [0, 2])
def test_job_retries_reach_rq(retries, tmp_path, redis_url, vllm_server):
    from pathlib import Path

    s = _settings(tmp_path, redis_url, vllm_server, retries)
    src = str(Path(__file__).resolve().parents[2] / GSM8K)
    report = enqueue(s, src, 4, 2, say=lambda m: None)
    assert len(report.jobs) == 2
    q = get_queue(q_client(redis_url), "dsretry", "generate")
    assert q.count == 2
    for jid in report.jobs:
        job = fetch_job(q.connection, jid)
        assert job.retries_left == (retries or None)
        assert (job.retry_intervals or []) == ([5, 30] if retries else [])
        # the request timeout is a host key: a job carries the run's lengths, and its worker derives the timeout
        # from them and its own decode rate (1,024 tokens: the 3,600-s floor)
        gen = job.kwargs["settings"]["generation"]
        assert gen["max_tokens"] == s.generation.max_tokens and "request_timeout_s" not in gen, gen


def q_client(url):
    import redis

    return redis.Redis.from_url(url)

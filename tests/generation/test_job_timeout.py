"""A generation job's rq timeout covers the retries of one request: derived from the lengths when unset, said
when set shorter. Real enqueues on the real Redis, against the local stand-in target (bench/stub_target.py: a real
HTTP server, only `/v1/models` is asked here)."""

from __future__ import annotations

import pytest
from draftsmith.generation.enqueue import enqueue
from draftsmith.jobqueue.queues import fetch_job, get_queue
from draftsmith.target.defaults import generation_job_timeout_s, retry_budget_s
from pool_helpers import Stub, settings_for, write_prompts_source


def test_the_derived_job_timeout_covers_every_attempt_of_a_long_answer(tmp_path, redis_url):
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": "one?"}, {"question": "two?"}])
    stub = Stub()
    said: list[str] = []
    try:
        s = settings_for(tmp_path, redis_url, stub.url, max_tokens=32768, backoff_s=1.0)
        report = enqueue(s, str(src), None, 2, say=said.append)
    finally:
        stub.close()
    (jid,) = report.jobs
    job = fetch_job(get_queue(_client(redis_url), "dstest", "generate").connection, jid)
    # 32,768 tokens at 10 tok/s: 6,554-s requests, 6 attempts and their back-off (1.5 x (1+2+4+8+16) s), + 600 s
    assert retry_budget_s(s.generation) == pytest.approx(6 * 2 * 32768 / 10 + 46.5)
    assert job.timeout == generation_job_timeout_s(s.generation) == 39968 > 6 * 3600
    assert not [m for m in said if "job_timeout_s" in m]


def test_a_set_job_timeout_shorter_than_the_retries_is_said_and_kept(tmp_path, redis_url):
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": "one?"}])
    stub = Stub()
    said: list[str] = []
    try:
        s = settings_for(tmp_path, redis_url, stub.url, max_tokens=32768, job_timeout_s=21600)
        report = enqueue(s, str(src), None, 1, say=said.append)
    finally:
        stub.close()
    warning = next(m for m in said if "job_timeout_s" in m)
    assert "generation.job_timeout_s=21600 s is shorter than the retries of one request" in warning
    assert "6 attempts of 6,554 s" in warning and "leave it unset to derive it" in warning
    job = fetch_job(get_queue(_client(redis_url), "dstest", "generate").connection, report.jobs[0])
    assert job.timeout == 21600  # the operator's value stands


def _client(url):
    import redis

    return redis.Redis.from_url(url)

"""Stragglers handed off to the run's tail (generation.handoff_after_s), on real processes: a real `draftsmith
worker` pool, the real Redis, and bench/stub_target.py in its slow-tail mode standing in for the target. A tail
that slow and that predictable cannot be had from vLLM (which answers as fast as it can), so the stub is the
target here: which prompts are slow follows from a hash of their text, the same for every attempt."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis
from draftsmith.generation.enqueue import active_prompt_ids, enqueue
from draftsmith.generation.store import iter_records, load_prompts
from draftsmith.generation.tail import tail_ids, tail_key
from draftsmith.jobqueue.queues import fetch_job, get_queue
from draftsmith.run_health import queue_health
from pool_helpers import REPO, Stub, settings_for, start_pool, stop_pool, wait_for, write_prompts_source

sys.path.insert(0, str(REPO / "bench"))
from stub_target import is_slow  # noqa: E402

QUESTIONS = [f"What is {i} times {i + 1}?" for i in range(24)]
FRACTION, DELAY_S, FACTOR = 0.1, 0.05, 100  # slow answers take 5 s; the batch jobs hand them off after 0.5 s


def slow_questions() -> set[str]:
    return {q for q in QUESTIONS
            if is_slow(json.dumps({"messages": [{"role": "user", "content": q}]}).encode(), FRACTION)}


@pytest.mark.slow
def test_slow_answers_go_to_a_tail_job_and_every_prompt_gets_one_record(tmp_path, redis_url):
    """3 of 24 answers are 100x slower: each batch job (8 prompts) finishes without its straggler, the stragglers
    run together in tail jobs, every prompt has exactly one record, and nothing is left on the tail list."""
    slow = slow_questions()
    assert len(slow) == 3  # one per batch of 8 (prompts 0, 11 and 23)
    stub = Stub(DELAY_S, 0, "--tail-fraction", str(FRACTION), "--tail-factor", str(FACTOR))
    s = settings_for(tmp_path, redis_url, stub.url, batch_size=8, concurrency=16, handoff_after_s=0.5)
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": q} for q in QUESTIONS])
    root = Path(s.runs_dir) / "t"
    pool = start_pool(s, "--processes", "2", "--metrics-port", "0")
    try:
        rep = enqueue(s, str(src), None, 8, say=lambda m: None)
        assert len(rep.jobs) == 3
        assert wait_for(lambda: len(list(iter_records(root / "records"))) >= 24, 60, every=0.2)
        stats = stub.stats()
    finally:
        out = stop_pool(pool)
        stub.close()
    records = list(iter_records(root / "records"))
    counts = Counter(r["id"] for r in records)
    assert len(counts) == 24 and set(counts.values()) == {1}, (counts, out[-3000:])
    question = {pid: p["messages"][-1]["content"] for pid, p in load_prompts(root / "prompts.jsonl").items()}
    client = redis.Redis.from_url(redis_url)
    batch_end = {jid: fetch_job(client, jid).ended_at for jid in rep.jobs}
    for r in records:
        job = fetch_job(client, r["job_id"])
        if question[r["id"]] in slow:
            assert job.kwargs.get("tail") is True and r["job_id"] not in rep.jobs
            assert r["turns"][0]["latency_s"] >= DELAY_S * FACTOR * 0.9  # the whole answer, from the tail job
            assert job.ended_at > max(batch_end.values())  # the batch jobs did not wait for it
        else:
            assert r["job_id"] in rep.jobs
    # each slow prompt was asked twice (the cancelled attempt, then the tail job's), every other one once; a
    # connection reset on a loaded host may add a retry, never remove an attempt
    assert stats["slow"] >= 6 and stats["requests"] >= 24 + 3
    assert client.llen(tail_key(s.redis.prefix, root)) == 0


def test_ids_on_the_tail_list_are_active_shown_and_moved_by_a_resume(tmp_path, redis_url):
    """A prompt handed off whose tail job was never enqueued (the process died between the hand-off and the end of
    its job): `status` counts it on the tail, and `enqueue` (resume) does not give it a batch job but a tail job."""
    stub = Stub()
    try:
        s = settings_for(tmp_path, redis_url, stub.url)
        src = write_prompts_source(tmp_path / "src.jsonl", [{"question": q} for q in QUESTIONS[:6]])
        root = Path(s.runs_dir) / "t"
        enqueue(s, str(src), None, 4, dry_run=True, say=lambda m: None)
        client = redis.Redis.from_url(redis_url)
        first = enqueue(s, str(src), None, 4, say=lambda m: None)
        q = get_queue(client, s.redis.prefix, "generate")
        ids = sorted(load_prompts(root / "prompts.jsonl"))
        for jid in first.jobs:  # the batch jobs are gone, one prompt is on the tail list
            fetch_job(client, jid).delete()
        client.rpush(tail_key(s.redis.prefix, root), ids[0])
        assert tail_ids(client, s.redis.prefix, root) == {ids[0]}
        assert active_prompt_ids(q, root) == {ids[0]}
        health = queue_health(client, s.redis.prefix, root)
        assert (health.tail, health.unassigned) == (1, 5) and "1 handed off to the tail" in health.line()
        rep = enqueue(s, None, None, 4, say=lambda m: None)
    finally:
        stub.close()
    jobs = [fetch_job(client, j) for j in rep.jobs]
    tails = [j for j in jobs if j.kwargs.get("tail")]
    assert [j.kwargs["prompt_ids"] for j in tails] == [[ids[0]]]
    batched = [i for j in jobs if not j.kwargs.get("tail") for i in j.kwargs["prompt_ids"]]
    assert sorted(batched) == ids[1:]
    assert client.llen(tail_key(s.redis.prefix, root)) == 0

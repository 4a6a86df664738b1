"""Resume after a worker was killed holding a job: `status` says what to do, `enqueue` does it, and every prompt gets
exactly one record. Real Redis, real rq workers and pools, the real CLI; the target is the local stand-in server
(bench/stub_target.py), since the pool, not a model, is under test and its answers must be slow on demand.

Before: a job left by a killed worker kept its id (status ``queued`` on rq's intermediate list, or ``started`` in
the started registry); `status` said "no job queued or running -> draftsmith enqueue" or "running", and `enqueue`
printed "Enqueued 0 jobs" because the job id existed, until rq's maintenance cleared it 10-20 minutes later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import iter_records
from draftsmith.jobqueue.liveness import DEQUEUE_GRACE_S, JobState, census
from draftsmith.jobqueue.queues import get_queue
from pool_helpers import (
    Stub,
    env_for,
    settings_for,
    start_pool,
    stop_pool,
    wait_for,
    wait_pool,
    write_prompts_source,
)
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer


def _status(s) -> str:
    p = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--run", "t"], env=env_for(s),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return next(line for line in p.stdout.splitlines() if line.startswith("generation"))


def _record_counts(s) -> Counter:
    return Counter(r["id"] for r in iter_records(Path(s.runs_dir) / "t" / "records"))


def test_enqueue_requeues_a_job_its_dead_worker_had_only_dequeued(tmp_path, redis_url):
    """The state a worker SIGKILLed right after its dequeue leaves (rq's LMOVE to the intermediate list, nothing
    after it): a live worker starts a dequeued job at once, so after DEQUEUE_GRACE_S it is orphaned."""
    stub = Stub()
    s = settings_for(tmp_path, redis_url, stub.url)
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": f"q{i}?"} for i in range(6)])
    try:
        enqueue(s, str(src), None, 4, say=lambda m: None)
        queue = get_queue(redis.Redis.from_url(redis_url), s.redis.prefix, "generate")
        jid = queue.connection.lmove(queue.key, queue.intermediate_queue_key).decode()
        assert "missing 6: 2 queued, 4 being started" in _status(s)  # a live worker may still start it
        time.sleep(DEQUEUE_GRACE_S + 0.5)
        line = _status(s)
        assert "missing 6: 2 queued, 4 held by a worker that is gone -> `draftsmith enqueue --run t`" in line, line
        said: list[str] = []
        report = enqueue(s, None, None, 4, say=said.append)
        assert report.requeued == 1 and report.jobs == [] and report.queued_already == 6, said
        assert "Requeued 1 job(s) of 4 prompts whose worker is gone (killed after it took them)" in said
        assert queue.get_job_ids()[0] == jid  # at the front, same id and arguments
        assert "missing 6: 6 queued" in _status(s)
        out = wait_pool(start_pool(s, "--burst", "--metrics-port", "0"), 120)
    finally:
        stub.close()
    counts = _record_counts(s)
    assert len(counts) == 6 and set(counts.values()) == {1}, out[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["at_dequeue", "while_running"])
def test_killed_with_its_job_the_status_advice_comes_within_two_minutes_and_resumes_every_prompt_once(
        tmp_path, redis_url, moment):
    """A whole pool (worker and work-horse) SIGKILLed the moment its job shows up in rq's intermediate list or
    started registry (``at_dequeue``), or once its work-horse runs it (``while_running``: the worker's heartbeats
    stop, and after HEARTBEAT_GRACE_S the job counts as orphaned), timed by polling rq's registries; then, as an
    operator would: `status` until it gives advice, run it, start a new pool."""
    slow, fast = Stub(delay_s=600), Stub()
    s = settings_for(tmp_path, redis_url, slow.url)
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": f"q{i}?"} for i in range(8)])
    try:
        enqueue(s, str(src), None, 4, say=lambda m: None)
        conn = redis.Redis.from_url(redis_url)
        queue = get_queue(conn, s.redis.prefix, "generate")
        started = StartedJobRegistry(queue.name, connection=conn, serializer=JSONSerializer)
        first = queue.get_job_ids()[0]
        pool = start_pool(s, "--metrics-port", "0")
        taken = wait_for(lambda: first in started.get_job_ids(cleanup=False)
                         or (moment == "at_dequeue" and first in queue.intermediate_queue.get_job_ids()), 60, 0.01)
        os.killpg(pool.pid, signal.SIGKILL)  # a host or container gone: pool, worker and work-horse at once
        t_kill = time.time()
        pool.wait(10)
        assert taken, stop_pool(pool)
        assert census(queue).jobs[first][0] in (JobState.RUNNING, JobState.DEQUEUED)  # not known dead yet
        advice = wait_for(lambda: (line := _status(s)) and "-> `draftsmith enqueue" in line and line, 110, 2)
        detected_s = time.time() - t_kill  # the operator's wait: the kill until `status` says what to do
        assert advice and "missing 8: 4 queued, 4 held by a worker that is gone" in advice, advice
        said: list[str] = []
        report = enqueue(s, None, None, 4, say=said.append)
        assert report.requeued == 1, said
        out = wait_pool(start_pool(s, "--burst", "--metrics-port", "0", DRAFTSMITH_TARGET__URL=fast.url), 120)
    finally:
        slow.close()
        fast.close()
    counts = _record_counts(s)
    assert len(counts) == 8 and set(counts.values()) == {1}, out[-2000:]
    assert detected_s < 120, detected_s
    assert json.loads((Path(s.runs_dir) / "t" / "prompts.jsonl").read_text().splitlines()[0])["id"] in counts

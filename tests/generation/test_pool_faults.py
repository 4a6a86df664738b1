"""Faults of the worker pool's processes, on real processes: real `draftsmith worker` pools (rq forks
workers, work-horses and the scheduler), the real Redis, and a real local HTTP server standing in for the target
(bench/stub_target.py: it is the pool under test, not a model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import psutil
import pytest
import redis
from draftsmith.generation.enqueue import enqueue, job_settings
from draftsmith.generation.store import iter_records
from draftsmith.jobqueue.inflight import InflightCap, owner_id
from draftsmith.target.server import free_port
from pool_helpers import (
    Stub,
    horses_of,
    settings_for,
    start_pool,
    stop_pool,
    wait_for,
    wait_pool,
    workers_of,
    write_prompts_source,
)

FORK_WHILE_LOCKED = r"""
import os, sys, threading
from pathlib import Path
import draftsmith.metrics as M
M.prepare_multiprocess_dir(Path(sys.argv[1]))
M.GEN_INFLIGHT.labels("r").inc()                       # values exist: the lock is prometheus-client's shared one
from prometheus_client import values
fn = values.ValueClass.inc
lock = fn.__closure__[fn.__code__.co_freevars.index("lock")].cell_contents
held, go = threading.Event(), threading.Event()
def writer():                                         # the pool's thread, caught inside a metric write
    with lock:
        held.set()
        go.wait(1.0)
threading.Thread(target=writer).start()
held.wait()
pid = os.fork()                                       # rq forking a worker or a work-horse right then
if pid == 0:
    M.GEN_INFLIGHT.labels("r").inc()                  # the work-horse's first write
    os._exit(0)
go.set()
print("child exited", os.waitpid(pid, 0)[1])
"""


def test_fork_while_another_thread_holds_the_metrics_lock_does_not_hang(tmp_path):
    p = subprocess.run([sys.executable, "-c", FORK_WHILE_LOCKED, str(tmp_path / "mp")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "child exited 0"


def test_extract_pool_does_not_change_the_generators_cap(tmp_path, redis_url):
    s = settings_for(tmp_path, redis_url, "http://127.0.0.1:9")
    for args in (["--queues", "generate", "--concurrency", "7"], ["--queues", "extract", "--concurrency", "1"]):
        p = start_pool(s, "--burst", "--metrics-port", "0", *args)
        out = wait_pool(p, 120)
        assert p.returncode == 0, out
    cap = InflightCap(redis.Redis.from_url(redis_url), "dstest", 128, stage="generate", target=s.target.url)
    assert cap.cap() == 7
    # another target behind the same Redis keeps its own cap (its pool sets it; until then, the default)
    assert InflightCap(redis.Redis.from_url(redis_url), "dstest", 128, target="http://other:8000").cap() == 128


def test_killed_work_horse_returns_its_leases_and_gauge(tmp_path, redis_url):
    stub = Stub(delay_s=60)
    s = settings_for(tmp_path, redis_url, stub.url, concurrency=16)
    enqueue(s, str(Path(__file__).parents[2] / "data" / "prompts" / "gsm8k_train.jsonl"), 4, 4, say=lambda m: None)
    port = free_port()
    pool = start_pool(s, "--metrics-port", str(port), "--concurrency", "16")
    r = redis.Redis.from_url(redis_url)
    cap = InflightCap(r, "dstest", 16, stage="generate", target=stub.url)
    try:
        assert wait_for(lambda: stub.stats()["inflight"] == 4, 90), stub.stats()
        assert cap.in_flight() == 4

        def gauge() -> float:
            for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
                if line.startswith('draftsmith_generation_inflight{run="t"}'):
                    return float(line.split()[-1])
            return 0.0

        assert gauge() == 4.0
        (worker,) = workers_of(pool.pid)
        (horse,) = horses_of(worker)
        horse.send_signal(signal.SIGKILL)
        # returned by the worker that saw its horse die: seconds, not the hour the old lease lived
        assert wait_for(lambda: cap.in_flight() == 0, 20), r.zrange(cap.key, 0, -1)
        assert gauge() == 0.0
    finally:
        out = stop_pool(pool)
        stub.close()
    assert "returned them" in out


def test_leases_of_a_live_request_are_renewed_and_expire_after_a_lost_holder(redis_url):
    r = redis.Redis.from_url(redis_url)
    cap = InflightCap(r, "dstest", 4, lease_s=1.5)
    tok = cap.try_acquire()
    for _ in range(4):  # a request longer than the lease keeps it while its holder renews
        time.sleep(0.5)
        assert cap.renew() == 1
    assert cap.in_flight() == 1
    time.sleep(1.8)  # the holder stops renewing (its machine is gone): the lease expires by itself
    assert cap.in_flight() == 0
    assert tok.startswith(f"{owner_id()}:") and owner_id().endswith(f":{os.getpid()}")


@pytest.mark.slow
def test_scheduler_dies_with_its_killed_worker(tmp_path, redis_url):
    s = settings_for(tmp_path, redis_url, "http://127.0.0.1:9")
    pool = start_pool(s, "--metrics-port", "0")
    r = redis.Redis.from_url(redis_url)
    lock = "rq:scheduler-lock:dstest:generate"
    try:
        (worker,) = wait_for(lambda: workers_of(pool.pid) or None, 60)
        sched = wait_for(lambda: worker.children() or None, 60)[0]
        owner = wait_for(lambda: r.get(lock), 30)
        assert owner
        worker.send_signal(signal.SIGKILL)
        assert wait_for(lambda: not psutil.pid_exists(sched.pid) or sched.status() == psutil.STATUS_ZOMBIE, 15)
        # the dead scheduler let its lock go (the pool's respawned worker may hold it now, under another name)
        assert wait_for(lambda: r.get(lock) != owner, 15), r.get(lock)
    finally:
        stop_pool(pool)


@pytest.mark.slow
def test_job_timeout_keeps_the_finished_answers(tmp_path, redis_url):
    stub = Stub(delay_s=4)
    src = write_prompts_source(tmp_path / "src.jsonl", [
        {"question": "one?"}, {"question": "two?"}, {"turns": ["a?", "b?", "c?"]}])
    s = settings_for(tmp_path, redis_url, stub.url, job_timeout_s=10, job_retries=1)
    try:
        enqueue(s, str(src), None, 3, say=lambda m: None)
        p = start_pool(s, "--burst", "--metrics-port", "0")
        out = wait_pool(p, 120)
    finally:
        stub.close()
    recs = list(iter_records(Path(s.runs_dir) / "t" / "records"))
    assert sorted(r["messages"][0]["content"] for r in recs) == ["one?", "two?"], out[-3000:]
    assert all(r["status"] == "ok" for r in recs)


def test_no_secret_travels_in_job_kwargs_and_the_worker_uses_its_own(tmp_path, redis_url):
    stub = Stub()
    s = settings_for(tmp_path, redis_url, stub.url)
    s.target.api_key = "sk-very-secret-key"
    carried = job_settings(s.model_copy(update={"redis": s.redis.model_copy(
        update={"url": "redis://:hunter2pass@10.0.0.5:6380/3"})}))
    # the job carries the run's part only: no Redis, no target URL or key (the worker's own apply)
    assert "redis" not in carried and carried["target"] == {"model": "stub"}
    try:
        enqueue(s, str(Path(__file__).parents[2] / "data" / "prompts" / "gsm8k_train.jsonl"), 2, 2,
                say=lambda m: None)
        r = redis.Redis.from_url(redis_url)
        datas = [zlib.decompress(r.hget(k, "data")) for k in r.keys("rq:job:*")
                 if r.type(k) == b"hash" and r.hexists(k, "data")]
        assert len(datas) == 1 and b'"prompt_ids"' in datas[0]
        assert b"sk-very-secret-key" not in datas[0] and b"api_key" not in datas[0]
        p = start_pool(s, "--burst", "--metrics-port", "0", DRAFTSMITH_TARGET__API_KEY="sk-very-secret-key")
        wait_pool(p, 120)
        assert stub.stats()["auth"] == "Bearer sk-very-secret-key"
    finally:
        stub.close()
    assert len(list(iter_records(Path(s.runs_dir) / "t" / "records"))) == 2


def test_bare_worker_serves_metrics_on_loopback_only(tmp_path, redis_url):
    s = settings_for(tmp_path, redis_url, "http://127.0.0.1:9")
    port = free_port()
    pool = start_pool(s, "--metrics-port", str(port))
    try:
        assert wait_for(lambda: [c for c in psutil.Process(pool.pid).net_connections("tcp")
                                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port], 60)
        (conn,) = [c for c in psutil.Process(pool.pid).net_connections("tcp") if c.laddr.port == port]
        assert conn.laddr.ip == "127.0.0.1"
    finally:
        stop_pool(pool)


@pytest.mark.slow
def test_full_disk_stops_the_worker_with_one_line_and_the_run_resumes(tmp_path, redis_url):
    """An 8 MiB tmpfs mounted over the runs folder in a private mount namespace (`unshare -rm`: no root needed).
    After enqueue the disk is filled but for ~500 kB; answers of ~100 kB fill it in the second job. The pool must stop with
    one line and no traceback, leave no temporary file nor shard without sidecar, and finish the run once space
    is freed: every prompt exactly once."""
    stub = Stub(answer_bytes=100_000)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dstest", "DRAFTSMITH_RUNS_DIR": str(runs),
           "DRAFTSMITH_TARGET__URL": stub.url, "DRAFTSMITH_TARGET__MODEL": "stub", "DRAFTSMITH_RUN": "t",
           "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0"}
    src = Path(__file__).parents[2] / "data" / "prompts" / "gsm8k_train.jsonl"
    ds = f"{sys.executable} -m draftsmith"
    rec = f"{runs}/t/records"
    script = f"""
mount -t tmpfs -o size=8m none {runs} || exit 97
{ds} enqueue --source {src} --limit 40 --batch-size 4 --max-tokens 8 >/dev/null || exit 98
head -c 500000 /dev/zero > {runs}/spare; head -c 16000000 /dev/zero > {runs}/filler 2>/dev/null; rm {runs}/spare
{ds} worker --burst --processes 1 --metrics-port 0 > {tmp_path}/first.log 2>&1; echo "first rc $?"
ls -a {rec} > {tmp_path}/ls.txt
{sys.executable} -c "from draftsmith.generation.store import done_ids; print('partial', len(done_ids(__import__('pathlib').Path('{rec}'))))"
rm {runs}/filler
{ds} enqueue > /dev/null; {ds} worker --burst --processes 1 --metrics-port 0 > {tmp_path}/second.log 2>&1; echo "second rc $?"
{sys.executable} -c "from draftsmith.generation.store import iter_records; import collections, pathlib; \
c = collections.Counter(r['id'] for r in iter_records(pathlib.Path('{rec}'))); print('done', len(c), max(c.values()))"
"""
    try:
        p = subprocess.run(["unshare", "-rm", "sh", "-c", script], env={**os.environ, **env}, capture_output=True,
                           text=True, timeout=600)
    finally:
        stub.close()
    first = (tmp_path / "first.log").read_text()
    assert "first rc 2" in p.stdout, p.stdout + p.stderr + first[-3000:]
    assert "Traceback" not in first and "OSError" not in first, first[-3000:]
    last = first.strip().splitlines()[-1]
    assert last.startswith("error: ") and "disk" in last and "free some space" in last, last
    assert "could not be written (they will be generated again)" in first  # never thrown away silently
    names = (tmp_path / "ls.txt").read_text().split()
    assert not [n for n in names if ".tmp-" in n]
    assert {n[: -len(".jsonl")] for n in names if n.endswith(".jsonl")} == \
        {n[: -len(".meta.json")] for n in names if n.endswith(".meta.json")}
    partial = int(p.stdout.split("partial ")[1].split()[0])
    assert 0 < partial < 40, p.stdout
    assert "second rc 0" in p.stdout and "done 40 1" in p.stdout, p.stdout + (tmp_path / "second.log").read_text()


def test_long_lived_worker_regenerates_a_shard_removed_by_the_user(tmp_path, redis_url):
    """Workers keep the run's done ids in memory; a shard the user removed (the documented way to
    regenerate it) must be answered again after `enqueue`, by the same worker, exactly once."""
    stub = Stub()
    s = settings_for(tmp_path, redis_url, stub.url)
    src = str(Path(__file__).parents[2] / "data" / "prompts" / "gsm8k_train.jsonl")
    rec = Path(s.runs_dir) / "t" / "records"
    pool = start_pool(s, "--metrics-port", "0")
    try:
        enqueue(s, src, 8, 4, say=lambda m: None)
        assert wait_for(lambda: len(list(iter_records(rec))) == 8, 60)
        shard = sorted(rec.glob("gen-*.jsonl"))[0]
        gone = {json.loads(line)["id"] for line in shard.read_text().splitlines()}
        shard.unlink()
        shard.with_name(shard.name[: -len(".jsonl")] + ".meta.json").unlink()
        enqueue(s, None, None, 4, say=lambda m: None)
        assert wait_for(lambda: len(list(iter_records(rec))) == 8, 60)
    finally:
        stop_pool(pool)
        stub.close()
    ids = [r["id"] for r in iter_records(rec)]
    assert len(ids) == len(set(ids)) == 8 and gone <= set(ids)


@pytest.mark.slow
def test_metric_files_stay_bounded_and_counts_stay_exact(tmp_path, redis_url):
    """40 jobs, one forked work-horse each: the multiprocess folder keeps a bounded number of files (the dead
    horses' samples are folded into archives by the pool) and /metrics still counts every request."""
    stub = Stub()
    s = settings_for(tmp_path, redis_url, stub.url)
    mp = tmp_path / "mp"
    port = free_port()
    pool = start_pool(s, "--metrics-port", str(port), DRAFTSMITH_METRICS__MULTIPROC_DIR=str(mp))
    try:
        enqueue(s, str(Path(__file__).parents[2] / "data" / "prompts" / "gsm8k_train.jsonl"), 80, 2,
                say=lambda m: None)
        rec = Path(s.runs_dir) / "t" / "records"
        assert wait_for(lambda: len(list(iter_records(rec))) == 80, 120)
        assert wait_for(lambda: len(list(mp.glob("*.db"))) <= 8, 30), sorted(p.name for p in mp.glob("*.db"))
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        stop_pool(pool)
        stub.close()
    assert 'draftsmith_generation_requests_total{outcome="ok",run="t"} 80.0' in text.splitlines()
    assert 'draftsmith_generation_request_latency_seconds_count{run="t"} 80.0' in text.splitlines()
    assert 'draftsmith_generation_prompts_done{run="t"} 80.0' in text.splitlines()


def test_a_job_dequeued_by_a_worker_that_died_runs_within_two_minutes(tmp_path, redis_url):
    """A worker SIGKILLed right after it dequeued a job leaves that job on rq's intermediate list, in no queue and no
    registry. rq's maintenance hands it back, and the pool runs that maintenance every 30 s (rq's default of
    10 minutes left such a job waiting 10-20 minutes, and an empty queue meanwhile)."""
    from draftsmith.jobqueue.queues import get_queue
    from draftsmith.jobqueue.worker import MAINTENANCE_INTERVAL_S

    stub = Stub()
    s = settings_for(tmp_path, redis_url, stub.url)
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": f"q{i}?"} for i in range(4)])
    try:
        enqueue(s, str(src), None, 4, say=lambda m: None)
        queue = get_queue(redis.Redis.from_url(redis_url), s.redis.prefix, "generate")
        # what rq's dequeue does (LMOVE to the intermediate list), by a worker that is killed before it goes on
        jid = queue.connection.lmove(queue.key, queue.intermediate_queue_key)
        assert jid and queue.count == 0
        t0 = time.time()
        p = start_pool(s, "--metrics-port", "0")
        try:
            done = wait_for(lambda: len(list(iter_records(Path(s.runs_dir) / "t" / "records"))) == 4, 120, 1)
        finally:
            out = stop_pool(p)
    finally:
        stub.close()
    assert done, out[-3000:]
    assert time.time() - t0 < 60 + 3 * MAINTENANCE_INTERVAL_S  # two maintenance passes a minute apart, and the job


def test_a_generation_job_whose_run_settings_disagree_is_refused(tmp_path, redis_url):
    """Another checkout enqueues the run with another temperature while a job of the first is queued: the run
    records the new value, and the worker refuses the old job with both values, before any request, and for good
    (its rq retries would only repeat the refusal)."""
    from rq.job import Job

    stub = Stub()
    src = write_prompts_source(tmp_path / "src.jsonl", [{"question": "one?"}, {"question": "two?"}])
    a = settings_for(tmp_path, redis_url, stub.url, job_retries=3, temperature=0.0)
    b = settings_for(tmp_path, redis_url, stub.url, job_retries=3, temperature=0.7)
    try:
        (jid,) = enqueue(a, str(src), None, 2, say=lambda m: None).jobs
        assert enqueue(b, str(src), None, 2, say=lambda m: None).jobs == []  # its prompts are queued already
        before = stub.stats()["requests"]
        wait_pool(start_pool(a, "--burst", "--metrics-port", "0"), 120)
        assert stub.stats()["requests"] == before
    finally:
        stub.close()
    job = Job.fetch(jid, connection=redis.Redis.from_url(redis_url))
    err = job.latest_result().exc_string
    assert job.is_failed and "generation.temperature: job 0.0, run 0.7" in err and "draftsmith enqueue" in err
    assert list(iter_records(Path(a.runs_dir) / "t" / "records")) == []

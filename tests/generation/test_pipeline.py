"""The generation stage against a real Redis and the real SmolLM2 on vLLM CPU: enqueue, worker pool, resume.

Workers run as real `draftsmith worker` processes (rq forks a work-horse per job), so SIGKILL and Redis flushes
hit the same code paths as in production.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest
import redis
from draftsmith.config import load_settings
from draftsmith.errors import ModelNotServed, TargetUnavailable
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.progress import snapshot
from draftsmith.generation.store import done_ids, iter_records
from draftsmith.jobqueue.queues import get_queue
from draftsmith.target.server import free_port
from pool_helpers import host_env, pool_output

REPO = Path(__file__).resolve().parents[2]
GSM8K = str(REPO / "data" / "prompts" / "gsm8k_train.jsonl")
MODEL = "SmolLM2-135M-Instruct"


def make_settings(tmp_path: Path, redis_url: str, url: str, **gen):
    return load_settings(None, {
        "runs_dir": str(tmp_path / "runs"), "run": "t",
        "redis": {"url": redis_url, "prefix": "dstest"},
        "target": {"url": url},
        "generation": {"max_tokens": 24, "batch_size": 2, "backoff_s": 0.05, **gen},
    })


def env_for(s) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
                "DRAFTSMITH_RUNS_DIR": str(s.runs_dir), "DRAFTSMITH_TARGET__URL": s.target.url, **host_env(s)})
    return env


def start_worker(s, *extra: str, processes: int = 1) -> subprocess.Popen:
    """A `draftsmith worker` in its own session, its output in a file (a pipe nobody reads while the test waits
    would block the pool once full; :func:`pool_helpers.pool_output` reads it)."""
    cmd = [sys.executable, "-m", "draftsmith", "worker", "--processes", str(processes), *extra]
    log = tempfile.TemporaryFile(mode="w+", prefix="draftsmith-pool-")
    proc = subprocess.Popen(cmd, env=env_for(s), stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    proc.output_file = log
    return proc


def run_burst(s) -> str:
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--burst", "--processes", "1",
                        "--metrics-port", "0"],
                       env=env_for(s), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return pool_output(proc)


def wait_for(cond, timeout=300, every=0.2):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        time.sleep(every)
    return False


def records_by_id(s) -> Counter:
    return Counter(r["id"] for r in iter_records(Path(s.runs_dir) / s.run / "records"))


@pytest.mark.e2e
def test_end_to_end_eight_prompts(tmp_path, redis_url, vllm_server):
    """The real SmolLM2 answers 8 pool prompts (64 new tokens at most): content, token ids match usage."""
    s = make_settings(tmp_path, redis_url, vllm_server, max_tokens=64, batch_size=4)
    lines: list[str] = []
    rep = enqueue(s, GSM8K, 8, 4, say=lines.append)
    assert "Extracted 8 unique questions" in lines and "Pending: 8 (skipping 0 already done)" in lines
    assert len(rep.jobs) == 2 and rep.model == MODEL
    run_burst(s)
    recs = list(iter_records(Path(s.runs_dir) / "t" / "records"))
    assert len(recs) == 8 and {r["status"] for r in recs} == {"ok"}
    for r in recs:
        assert r["schema"] == "draftsmith.record/1" and r["model"] == MODEL
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        assert r["messages"][1]["content"].strip()
        t = r["turns"][0]
        assert len(t["token_ids"]) == t["usage"]["completion_tokens"] <= 64
        assert len(t["prompt_token_ids"]) == t["usage"]["prompt_tokens"]  # the prompt as the server saw it
        assert t["finish_reason"] in ("stop", "length")
        assert r["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": 0}
    snap = snapshot(redis.Redis.from_url(redis_url), "dstest", Path(s.runs_dir) / "t")
    assert (snap.phase, snap.done, snap.total, snap.errors) == ("done", 8, 8, 0)
    assert snap.req_per_s > 0 and snap.out_tok_per_s > 0 and snap.mean_completion_tokens > 0
    # enqueue again: everything is done, nothing is enqueued
    lines.clear()
    rep2 = enqueue(s, GSM8K, 8, 4, say=lines.append)
    assert rep2.jobs == [] and "Pending: 0 (skipping 8 already done)" in lines


@pytest.mark.e2e
def test_multi_turn_sees_own_answers_and_context_errors_are_recorded(tmp_path, redis_url, vllm_server, fault_proxy):
    proxy = fault_proxy(vllm_server, faults=[])
    src = tmp_path / "mt.jsonl"
    src.write_text(json.dumps({"turns": ["Name a colour.", "Now name another one."]}) + "\n"
                   + json.dumps({"question": "word " * 5000}) + "\n")
    s = make_settings(tmp_path, redis_url, proxy.url, max_tokens=16)
    enqueue(s, str(src), None, 2, say=lambda m: None)
    run_burst(s)
    recs = {r["status"]: r for r in iter_records(Path(s.runs_dir) / "t" / "records")}
    mt = recs["ok"]
    assert [m["role"] for m in mt["messages"]] == ["user", "assistant", "user", "assistant"]
    assert len(mt["turns"]) == 2
    # the second request carried the target's own first answer
    assert mt["turns"][1]["usage"]["prompt_tokens"] > mt["turns"][0]["usage"]["prompt_tokens"] + \
        mt["turns"][0]["usage"]["completion_tokens"]
    err = recs["error"]
    assert err["error"]["reason"] == "context_length" and err["turns"] == []
    assert err["messages"][0]["content"].startswith("word word")
    h = redis.Redis.from_url(redis_url).hgetall(f"dstest:progress:{(Path(s.runs_dir) / 't').resolve()}")
    assert int(h[b"err:context_length"]) == 1  # counted once: never retried


@pytest.mark.e2e
def test_enqueue_twice_creates_no_duplicate_work(tmp_path, redis_url, vllm_server):
    s = make_settings(tmp_path, redis_url, vllm_server)
    r1 = enqueue(s, GSM8K, 6, 2, say=lambda m: None)
    lines: list[str] = []
    r2 = enqueue(s, GSM8K, 6, 2, say=lines.append)
    q = get_queue(redis.Redis.from_url(redis_url), "dstest", "generate")
    assert len(r1.jobs) == 3 and r2.jobs == [] and q.count == 3
    assert "Pending: 0 (skipping 0 already done, 6 already queued)" in lines
    run_burst(s)
    assert records_by_id(s) == Counter({i: 1 for i in done_ids(Path(s.runs_dir) / "t" / "records")})
    assert len(records_by_id(s)) == 6


def _horse_pids(worker: subprocess.Popen) -> list[int]:
    try:
        kids = psutil.Process(worker.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    # pool -> worker -> {work-horse, scheduler}: rq titles the horse "... Processing <func> ..."
    out = []
    for k in kids:
        try:
            if "Processing" in " ".join(k.cmdline()):
                out.append(k.pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.e2e
def test_sigkill_mid_job_leaves_exactly_one_record_per_prompt(tmp_path, redis_url, vllm_server):
    s = make_settings(tmp_path, redis_url, vllm_server, max_tokens=48)
    enqueue(s, GSM8K, 6, 3, say=lambda m: None)
    w = start_worker(s, "--metrics-port", "0")
    try:
        assert wait_for(lambda: _horse_pids(w), timeout=60), "no work-horse started"
        time.sleep(0.5)  # the job is sending its requests now
        for pid in _horse_pids(w):
            os.kill(pid, signal.SIGKILL)
        # rq sees the dead work-horse and Retry runs the job again; the other job runs as usual
        assert wait_for(lambda: len(records_by_id(s)) == 6, timeout=300)
    finally:
        out = stop(w)
    assert "terminated unexpectedly" in out or "died" in out.lower() or "killed" in out.lower(), out[-2000:]
    counts = records_by_id(s)
    assert len(counts) == 6 and set(counts.values()) == {1}


@pytest.mark.e2e
def test_redis_flush_mid_run_resumes_from_disk(tmp_path, redis_url, vllm_server):
    s = make_settings(tmp_path, redis_url, vllm_server, max_tokens=24)
    enqueue(s, GSM8K, 8, 2, say=lambda m: None)
    records = Path(s.runs_dir) / "t" / "records"
    w = start_worker(s, "--metrics-port", "0")
    try:
        assert wait_for(lambda: len(done_ids(records)) >= 2, timeout=120)
        redis.Redis.from_url(redis_url).flushdb()  # Redis keeps nothing: the queue and the progress are gone
        lines: list[str] = []
        enqueue(s, None, None, 2, say=lines.append)  # rebuilds what is pending from the shards
        assert any(line.startswith("Pending: ") for line in lines)
        assert wait_for(lambda: len(done_ids(records)) == 8, timeout=300)
    finally:
        stop(w)
    counts = records_by_id(s)
    assert len(counts) == 8 and set(counts.values()) == {1}


@pytest.mark.e2e
def test_worker_metrics_survive_forks(tmp_path, redis_url, vllm_server):
    s = make_settings(tmp_path, redis_url, vllm_server, max_tokens=8)
    enqueue(s, GSM8K, 4, 2, say=lambda m: None)
    port = free_port()
    w = start_worker(s, "--metrics-port", str(port))
    try:
        assert wait_for(lambda: len(records_by_id(s)) == 4, timeout=120)
        time.sleep(6)  # one refresh of the queue gauges
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        stop(w)
    # counters written by forked work-horses are summed by the pool's /metrics
    assert 'draftsmith_generation_requests_total{outcome="ok",run="t"} 4.0' in text
    assert 'draftsmith_generation_request_latency_seconds_count{run="t"} 4.0' in text
    assert 'draftsmith_workers_alive{queue="dstest:generate"} 1.0' in text
    assert 'draftsmith_queue_depth{queue="dstest:generate"} 0.0' in text


def test_bad_target_and_model_are_refused_before_enqueueing(tmp_path, redis_url):
    dead = f"http://127.0.0.1:{free_port()}"
    s = make_settings(tmp_path, redis_url, dead)
    with pytest.raises(TargetUnavailable, match="does not answer"):
        enqueue(s, GSM8K, 2, 2, say=lambda m: None)
    assert get_queue(redis.Redis.from_url(redis_url), "dstest", "generate").count == 0


@pytest.mark.e2e
def test_unknown_model_lists_served_ones(tmp_path, redis_url, vllm_server):
    s = make_settings(tmp_path, redis_url, vllm_server)
    s.target.model = "no-such-model"
    with pytest.raises(ModelNotServed, match="it serves: SmolLM2-135M-Instruct"):
        enqueue(s, GSM8K, 2, 2, say=lambda m: None)


def test_dry_run_validates_and_enqueues_nothing(tmp_path, redis_url):
    s = make_settings(tmp_path, redis_url, f"http://127.0.0.1:{free_port()}")  # no server needed for a dry run
    lines: list[str] = []
    rep = enqueue(s, GSM8K, 5, 2, dry_run=True, say=lines.append)
    # the derived request timeout is printed first, then the source is read and a seeded sample of it drawn
    assert lines[0].startswith("Default generation.request_timeout_s=3600 (derived: max_tokens"), lines
    assert lines[1] == f"Loading dataset {GSM8K}..."
    assert lines[2] == "Extracted 5 unique questions"
    assert lines[3].startswith("  a seeded sample (seed 0) of the source's "), lines
    assert lines[4:] == ["Pending: 5 (skipping 0 already done)", "Dry run: nothing enqueued"]
    assert rep.jobs == [] and not (Path(s.runs_dir) / "t" / "prompts.jsonl").exists()
    assert get_queue(redis.Redis.from_url(redis_url), "dstest", "generate").count == 0


def test_low_free_disk_is_refused_and_keeps_work(tmp_path, redis_url):
    from draftsmith.errors import DiskSpaceError

    s = make_settings(tmp_path, redis_url, f"http://127.0.0.1:{free_port()}", min_free_disk_gb=1e9)
    with pytest.raises(DiskSpaceError, match="GB free under"):
        enqueue(s, GSM8K, 2, 2, say=lambda m: None)
    assert get_queue(redis.Redis.from_url(redis_url), "dstest", "generate").count == 0


def test_status_shows_the_phase_from_the_first_second(tmp_path, redis_url):
    """Before a single record exists, `status` already says what the run is doing (failure mode 3)."""
    from draftsmith.generation.progress import ProgressBoard

    s = make_settings(tmp_path, redis_url, "http://127.0.0.1:1")
    root = Path(s.runs_dir) / "t"
    root.mkdir(parents=True)
    ProgressBoard(redis.Redis.from_url(redis_url), "dstest", root).set(phase="loading dataset")
    p = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--run", "t"], env=env_for(s),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("generation: [loading dataset] 0/0 done"), p.stdout + p.stderr


def test_cli_dead_target_is_one_line_exit_2(tmp_path, redis_url):
    s = make_settings(tmp_path, redis_url, f"http://127.0.0.1:{free_port()}")
    p = subprocess.run([sys.executable, "-m", "draftsmith", "enqueue", "--run", "t", "--source", GSM8K, "--limit", "2"],
                       env=env_for(s), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "does not answer" in err[0] and "draftsmith target serve" in err[0]
    assert "Extracted 2 unique questions" in p.stdout  # the source was fine; nothing was enqueued
    assert get_queue(redis.Redis.from_url(redis_url), "dstest", "generate").count == 0


@pytest.mark.e2e
def test_inflight_cap_is_shared_by_all_workers(tmp_path, redis_url, vllm_server, fault_proxy):
    """Two worker processes, jobs of 4 prompts each, cap 3: never more than 3 requests reach the server at once."""
    probe = fault_proxy(vllm_server, faults=[])  # no faults: it only counts requests in flight
    s = make_settings(tmp_path, redis_url, probe.url, max_tokens=16, concurrency=3)
    enqueue(s, GSM8K, 8, 4, say=lambda m: None)
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--burst", "--processes", "2",
                        "--concurrency", "3", "--metrics-port", "0"], env=env_for(s), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(records_by_id(s)) == 8
    assert probe.max_concurrent == 3  # reached, never exceeded

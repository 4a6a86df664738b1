"""Workers on two machines sharing nothing but Redis and an object store.

Each "host" is a real process tree in its own mount and pid namespace (``unshare -m -p -f --mount-proc``) with a
private, empty tmpfs over ``/tmp``: no shared disk, and pids that collide across hosts as in containers. One real
Redis, one real SeaweedFS (S3); the target is the pool tests' stand-in HTTP server (bench/stub_target.py: the
queue and the store are under test here, not the model; the same pool against the real SmolLM2 on vLLM CPU passed
too, 160 prompts, before this test moved off the shared server to spare CI's critical path). Host A's whole tree is
killed with SIGKILL mid-run (its namespace's pid 1 dies, so every process in it does, as when a machine is lost);
host B finishes, every prompt once.

Against a local ``runs_dir`` a worker on a host without the run folder stopped every job with FileNotFoundError;
now it refuses the job at once, puts it back, and says how to fix it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import redis
from draftsmith.artifacts import records as records_artifact
from draftsmith.config import load_settings
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import iter_records, record_tally
from draftsmith.jobqueue.inflight import InflightCap
from draftsmith.paths import RunPaths
from pool_helpers import Stub, pool_output, settings_for, stop_pool, wait_for

REPO = Path(__file__).resolve().parents[2]
GSM8K = str(REPO / "data" / "prompts" / "gsm8k_train.jsonl")


def start_host(s, *worker_args: str, env: dict[str, str]) -> subprocess.Popen:
    """A `draftsmith worker` pool as pid 1's child in a new mount + pid namespace, /tmp a fresh tmpfs of its own;
    its output goes to a file of the test (opened before the namespace hides /tmp)."""
    inner = (f"mount -t tmpfs -o size=64m tmpfs /tmp && cd / && exec {sys.executable} -m draftsmith worker "
             + " ".join(worker_args))
    full = dict(os.environ)
    full.update({"DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
                 "DRAFTSMITH_RUNS_DIR": str(s.runs_dir), "DRAFTSMITH_RUN": s.run,
                 "DRAFTSMITH_TARGET__URL": s.target.url, "DRAFTSMITH_GENERATION__MIN_FREE_DISK_GB": "0",
                 "PYTHONPATH": str(REPO / "shared"), **env})
    log = tempfile.TemporaryFile(mode="w+", prefix="draftsmith-host-")
    p = subprocess.Popen(["unshare", "--kill-child", "-m", "-p", "-f", "--mount-proc", "sh", "-c", inner], env=full,
                         stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    p.output_file = log
    return p


def shard_records_raw(records_dir) -> Counter:
    """How many records each prompt has over every sidecar'd shard, duplicates included."""
    c: Counter = Counter()
    for meta in records_dir.iterdir():
        if meta.name.endswith(records_artifact.SIDECAR_SUFFIX):
            c.update(json.loads(meta.read_text())["ids"])
    return c


@pytest.mark.slow
def test_two_hosts_regenerate_through_the_object_store_and_survive_losing_one(redis_url, s3_runs, seaweedfs):
    stub = Stub(delay_s=0.4)
    s = load_settings(None, {
        "runs_dir": s3_runs, "run": "mh", "redis": {"url": redis_url, "prefix": "dstest"},
        "target": {"url": stub.url, "model": "stub"},
        "generation": {"max_tokens": 16, "batch_size": 8, "concurrency": 8, "backoff_s": 0.05},
    })
    n = 240
    report = enqueue(s, GSM8K, n, 8, say=lambda m: None)
    assert report.pending == n and len(report.jobs) == n // 8
    records = RunPaths(s.runs_dir, s.run).records
    args = ("--queues", "generate", "--processes", "1", "--metrics-port", "0")
    host_a = start_host(s, *args, env=seaweedfs.env)
    host_b = start_host(s, *args, env=seaweedfs.env)
    try:
        # kill host A once both hosts have written records and A holds work
        assert wait_for(lambda: len(record_tally(records).ids) >= 64, 300, every=1.0), pool_output(host_a)[-3000:]
        out_a_before = pool_output(host_a)
        assert "records in" in out_a_before, out_a_before[-3000:]  # A finished jobs of its own
        os.killpg(host_a.pid, signal.SIGKILL)  # the namespace's pid 1 dies: every process of host A with it
        host_a.wait(30)
        # host B drains the queue; the jobs A held are orphaned until their heartbeats lapse, then a resume
        # (`draftsmith enqueue` from anywhere) hands them back
        def finished() -> bool:
            if len(record_tally(records).ids) >= n:
                return True
            enqueue(s, None, None, 8, say=lambda m: None)
            return False

        assert wait_for(finished, 420, every=10.0), pool_output(host_b)[-3000:]
    finally:
        out_b = stop_pool(host_b)
        if host_a.poll() is None:
            os.killpg(host_a.pid, signal.SIGKILL)
        stub.close()
    assert "records in" in out_b, out_b[-3000:]
    kept = [r["id"] for r in iter_records(records)]
    assert len(kept) == len(set(kept)) == n  # every prompt exactly once in what the next stage reads
    raw = shard_records_raw(records)
    assert set(raw) == set(kept) and max(raw.values()) == 1, [k for k, v in raw.items() if v > 1]
    resume = enqueue(s, None, None, 8, dry_run=True, say=lambda m: None)  # what a resume would see: nothing left
    assert resume.done == n and resume.pending == 0
    # host A's leases expire within the lease time; host B's were returned as its requests ended
    r = redis.Redis.from_url(redis_url)
    assert wait_for(lambda: InflightCap(r, "dstest", 1).in_flight_all_targets() == 0, 60, every=1.0)


def test_a_worker_without_the_local_run_folder_refuses_its_jobs(tmp_path, redis_url):
    stub = Stub()
    try:
        s = settings_for(tmp_path, redis_url, stub.url)
        report = enqueue(s, GSM8K, 4, 4, say=lambda m: None)
        # the run is under the test's /tmp; this host's /tmp is an empty tmpfs of its own
        host = start_host(s, "--queues", "generate", "--burst", "--processes", "1", "--metrics-port", "0", env={})
        host.wait(120)
        out = pool_output(host)
    finally:
        stub.close()
    assert host.returncode != 0, out
    assert "is not on this host" in out and "object store" in out, out[-3000:]
    assert "FileNotFoundError" not in out
    # the job is back in the queue for a worker that has the folder, not failed
    from draftsmith.jobqueue.queues import fetch_job

    (jid,) = report.jobs
    assert fetch_job(redis.Redis.from_url(redis_url), jid).get_status() == "queued"

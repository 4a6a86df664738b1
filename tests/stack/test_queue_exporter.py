"""The queue exporter against a real Redis: counts of rq's own registries become the draftsmith_queue_* gauges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import zlib

import httpx
import pytest
from draftsmith.jobqueue.exporter import collect
from draftsmith.jobqueue.queues import connect, get_queue
from draftsmith.target.server import free_port
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def prefix() -> str:
    return f"stacktest-{uuid.uuid4().hex[:8]}"


def test_collect_counts_waiting_and_failed_jobs(redis_url, prefix):
    client = connect(redis_url)
    q = get_queue(client, prefix, "generate")
    for i in range(3):
        q.enqueue("draftsmith.no_such_function", i, job_id=f"{prefix}-{i}")
    # job payloads in Redis are JSON (rq's JSONSerializer), never pickle
    raw = zlib.decompress(client.hget(f"rq:job:{prefix}-0", "data"))
    assert json.loads(raw)[0] == "draftsmith.no_such_function"
    job = q.fetch_job(f"{prefix}-2")
    q.remove(job)
    job.set_status("failed")
    q.failed_job_registry.add(job, exc_string="boom")  # a failed job, as rq records one
    stats = {s.queue: s for s in collect(client, prefix)}
    gen, ext = stats[f"{prefix}:generate"], stats[f"{prefix}:extract"]
    assert (gen.waiting, gen.started, gen.failed, gen.workers) == (2, 0, 1, 0)
    assert (ext.waiting, ext.failed) == (0, 0)
    assert REGISTRY.get_sample_value("draftsmith_queue_depth", {"queue": f"{prefix}:generate"}) == 2
    assert REGISTRY.get_sample_value("draftsmith_queue_failed_jobs", {"queue": f"{prefix}:generate"}) == 1
    assert REGISTRY.get_sample_value("draftsmith_workers_alive", {"queue": f"{prefix}:extract"}) == 0


def _depths(port: int) -> dict[str, float]:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "draftsmith_queue_depth":
            return {s.labels["queue"]: s.value for s in fam.samples}
    return {}


def test_queue_exporter_command_serves_metrics(redis_url, prefix, tmp_path):
    client = connect(redis_url)
    q = get_queue(client, prefix, "extract")
    for i in range(4):
        q.enqueue("draftsmith.no_such_function", i)
    port = free_port()
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": prefix}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    draftsmith = os.path.join(os.path.dirname(sys.executable), "draftsmith")
    log = (tmp_path / "log").open("w")
    proc = subprocess.Popen([draftsmith, "queue-exporter", "--port", str(port), "--interval", "0.5"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        values: dict[str, float] = {}
        deadline = time.time() + 60
        while time.time() < deadline and values.get(f"{prefix}:extract") != 4.0:
            time.sleep(0.5)
            values = _depths(port)
        assert values.get(f"{prefix}:extract") == 4.0, (tmp_path / "log").read_text()
        assert values.get(f"{prefix}:generate") == 0.0
        q.empty()  # the gauge follows the queue
        deadline = time.time() + 30
        while time.time() < deadline and values.get(f"{prefix}:extract") != 0.0:
            time.sleep(0.5)
            values = _depths(port)
        assert values.get(f"{prefix}:extract") == 0.0
    finally:
        proc.terminate()
        proc.wait(timeout=10)

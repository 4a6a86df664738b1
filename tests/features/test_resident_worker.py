"""An extraction worker loads the target once for every shard it takes, and a killed one loses only its shard: real
`draftsmith worker --queues extract` pools on a real Redis, the real SmolLM2 target (hf backend on CPU).

Before: rq forked a work-horse per job and the loaded target died with it (5 shards, 5 "loading target" lines).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import build_data
from draftsmith.features.queue import enqueue_shards
from draftsmith.jobqueue.liveness import HEARTBEAT_GRACE_S


def _settings(make_settings, run_dir: Path, redis_url: str):
    s = make_settings(run_dir)
    return s.model_copy(update={"redis": s.redis.model_copy(update={"url": redis_url, "prefix": "dsres"})})


def _pool(s, *args: str) -> subprocess.Popen:
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix}
    return subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--queues", "extract", "--processes", "1",
                             "--metrics-port", "0", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _done(run_dir: Path) -> int:
    return len(list((run_dir / "features").glob("features-*.json")))


def test_one_target_load_serves_every_shard(tmp_path, embedded_target, make_settings, redis_url):
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1, 1, 1, 1, 1))
    s = _settings(make_settings, run_dir, redis_url)
    assert len(enqueue_shards(s, str(run_dir), list(range(5)))) == 5
    p = _pool(s, "--burst")
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out[-3000:]
    assert _done(run_dir) == 5 and json.loads((run_dir / "features" / "manifest.json").read_text())["samples"] == 5
    assert out.count("loading target") == 1, out[-3000:]
    assert "1 resident process(es) on dsres:extract" in out


@pytest.mark.slow
def test_a_killed_extraction_worker_loses_only_its_shard(tmp_path, embedded_target, make_settings, redis_url):
    """SIGKILL the resident worker while it extracts; the pool starts another, which loads the target once, and
    `draftsmith extract` (run again, as `status` and the docs say) requeues the killed shard once its worker's
    heartbeats stop."""
    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1, 1, 1, 1))
    s = _settings(make_settings, run_dir, redis_url)
    enqueue_shards(s, str(run_dir), list(range(4)))
    p = _pool(s)
    try:
        deadline = time.time() + 300
        while _done(run_dir) < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert _done(run_dir) >= 1
        (worker,) = psutil.Process(p.pid).children()
        worker.kill()  # mid-shard or between shards: either way at most its current shard is lost
        t_kill = time.time()
        while time.time() - t_kill < HEARTBEAT_GRACE_S + 5 and _done(run_dir) < 4:
            time.sleep(1)
        requeued = enqueue_shards(s, str(run_dir), [i for i in range(4)
                                                    if not (run_dir / "features" / f"features-{i:05d}.json").exists()])
        deadline = time.time() + 300
        while _done(run_dir) < 4 and time.time() < deadline:
            time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        out = p.communicate(timeout=60)[0]
    assert _done(run_dir) == 4, out[-3000:]
    assert out.count("loading target") == 2, out[-3000:]  # the first worker, then its replacement: once each
    assert len(requeued) <= 1


def _scrape(port: int, name: str) -> float | None:
    """The value of the metric ``name`` (one label set) on the pool's /metrics, or None when it has none."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{")]
    return values[0] if values else None


def _probe(port: int) -> str:
    """scripts/gpu-handover.py's probe of the extractor's held gauge, run against this pool's /metrics."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu-handover.py"
    spec = importlib.util.spec_from_file_location("gpu_handover", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    code = mod.HELD_PROBE.replace("127.0.0.1:9400", f"127.0.0.1:{port}")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()


def _wait_for(check, timeout_s: float, what: str, log: Path):
    """Poll ``check`` until true, else fail with the end of the worker's log."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.05)
    pytest.fail(f"{what} not within {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.mark.slow  # 25 s here: a worker process, two target loads and the idle wait
def test_an_idle_extraction_worker_frees_the_target_and_loads_it_for_the_next_job(
        tmp_path, embedded_target, make_settings, redis_url):
    """A real resident worker on a real Redis: after a shard its queue stays empty for extract.release_idle_s, it
    frees the target (its log and draftsmith_extract_target_held on the pool's /metrics say so), and the next job
    loads it again."""
    import socket

    run_dir = tmp_path / "runs" / "t"
    build_data(run_dir, embedded_target, shard_sizes=(1, 1))
    s = _settings(make_settings, run_dir, redis_url)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "worker.log"
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": s.redis.url, "DRAFTSMITH_REDIS__PREFIX": s.redis.prefix,
           "DRAFTSMITH_EXTRACT__RELEASE_IDLE_S": "3", "DRAFTSMITH_METRICS__ADDR": "127.0.0.1"}
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "draftsmith", "worker", "--queues", "extract", "--processes", "1",
                              "--metrics-port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    held = "draftsmith_extract_target_held"
    try:
        enqueue_shards(s, str(run_dir), [0])
        _wait_for(lambda: _done(run_dir) == 1, 300, "shard 0", log)
        assert _scrape(port, held) == 1  # loaded, within the 3 s
        assert _scrape(port, "draftsmith_extract_target_loads_total") == 1  # counted in the worker, seen by the pool
        _wait_for(lambda: "released target" in log.read_text(), 60, "the release", log)
        assert _scrape(port, held) == 0
        assert _probe(port) == "0.0"  # what `make train` reads inside the extractor container
        text = log.read_text()
        assert "(extract.release_idle_s)" in text and text.count("loading target") == 1
        enqueue_shards(s, str(run_dir), [1])
        _wait_for(lambda: _done(run_dir) == 2, 300, "shard 1", log)
        assert log.read_text().count("loading target") == 2  # loaded again for the next job
        assert _scrape(port, held) == 1 and _probe(port) == "1.0"
        assert _scrape(port, "draftsmith_extract_target_loads_total") == 2
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)

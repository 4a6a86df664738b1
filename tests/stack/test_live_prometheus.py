"""The dashboards against a real Prometheus: a small real generation run, scraped live, every query answered.

Starts Debian's `prometheus` (scripts/ci-system-deps.sh installs it) on a free port with a generated config that
scrapes a real `draftsmith worker` pool (its /metrics), `draftsmith queue-exporter`, and the vLLM CPU server
(`vllm_server` fixture; TEST_DRAFTSMITH_VLLM_URL reuses the dev server). A few short prompts, plus one longer than
the server's context (a real HTTP 400, counted as `context_length`), are enqueued with `draftsmith enqueue`. Then
every dashboard query whose metrics these sources export is evaluated over the run (query_range) and must return
at least one finite value. Queries of sources not running here (extraction, training, evaluation, SGLang, vLLM
speculative decoding) are checked by name only, in test_dashboards.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import redis as redis_lib
from draftsmith.target.server import free_port
from stack_helpers import concrete, dashboard_queries, promql_metric_names

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
DRAFTSMITH = str(Path(sys.executable).with_name("draftsmith"))
# sources running in this test, by metric-name prefix
LIVE_PREFIXES = ("draftsmith_generation_", "draftsmith_queue_", "draftsmith_workers_", "vllm:")
NOT_LIVE = ("vllm:spec_decode_",)  # the dev server has no drafter


def _live(expr: str) -> bool:
    names = promql_metric_names(expr)
    return all(n.startswith(LIVE_PREFIXES) and not n.startswith(NOT_LIVE) for n in names)


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _prom_config(path: Path, worker_port: int, exporter_port: int, vllm_url: str) -> None:
    vllm = urlparse(vllm_url)
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "generator", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
            {"job_name": "queue-exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
            {"job_name": "target", "static_configs": [{"targets": [vllm.netloc]}]},
        ],
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML


def _range(prom: str, expr: str, start: float, end: float) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": "1s"},
                  timeout=30)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture
def private_redis(tmp_path):
    """URL of a redis-server of this test's own, on a free port: the run takes minutes, and other tests flush the
    shared test database meanwhile (the jobs of a run vanished that way)."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if redis_lib.Redis.from_url(url).ping():
                break
        except redis_lib.ConnectionError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_dashboard_queries_return_data_from_live_sources(vllm_server, private_redis, tmp_path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus missing: run scripts/ci-system-deps.sh (apt-get install prometheus)"
    run = f"stack-{uuid.uuid4().hex[:6]}"
    prefix = f"stacktest-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": private_redis, "DRAFTSMITH_REDIS__PREFIX": prefix,
           "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), "DRAFTSMITH_METRICS__MULTIPROC_DIR": str(tmp_path / "mp"),
           "DRAFTSMITH_TARGET__URL": vllm_server}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"question": q} for q in ("What is 2 + 3?", "Name a primary color.", "Say hello in French.",
                                      "What is the capital of Italy?", "Spell 'cat' backwards.")]
    rows.append({"question": "Summarise: " + "lorem ipsum dolor sit amet " * 900})  # beyond the 4096 context
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))

    worker_port, exporter_port, prom_port = free_port(), free_port(), free_port()
    cfg = tmp_path / "prometheus.yml"
    _prom_config(cfg, worker_port, exporter_port, vllm_server)
    procs = []
    try:
        procs.append(_start([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            tmp_path / "prometheus.log", env))
        procs.append(_start([DRAFTSMITH, "queue-exporter", "--port", str(exporter_port), "--interval", "1"],
                            tmp_path / "exporter.log", env))
        procs.append(_start([DRAFTSMITH, "worker", "--queues", "generate", "--processes", "1", "--concurrency", "2",
                             "--metrics-port", str(worker_port)], tmp_path / "worker.log", env))
        prom = f"http://127.0.0.1:{prom_port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{prom}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not start: " + (tmp_path / "prometheus.log").read_text()[-2000:])
        t0 = time.time()
        # Every target scraped before the run starts: counters need a sample from before the first job for rate()
        # to see it. Prometheus applies new targets a few seconds after start (its scrape manager batches updates),
        # and on a fast machine the whole run once ended before the target's first scrape (TTFT p95 had no data).
        deadline = time.time() + 60
        while time.time() < deadline:
            active = httpx.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            if len(active) == 3 and all(t["health"] == "up" for t in active):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus did not scrape every target: {active}")
        time.sleep(2)  # two more scrapes of each
        out = subprocess.run([DRAFTSMITH, "enqueue", "--source", str(prompts), "--run", run, "--batch-size", "2",
                              "--max-tokens", "24"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        records = tmp_path / "runs" / run / "records"
        deadline = time.time() + 300
        done = 0
        while time.time() < deadline:
            done = sum(1 for f in records.glob("*.jsonl") for line in f.read_text().splitlines() if line.strip())
            if done == len(rows):
                break
            time.sleep(1)
        assert done == len(rows), (tmp_path / "worker.log").read_text()[-3000:]
        time.sleep(5)  # the last scrapes
        t1 = time.time()

        checked, missing = [], []
        for dash, title, expr in dashboard_queries():
            if not _live(expr):
                continue
            q = concrete(expr, run_regex=run if "run=" in expr else ".*", rate_interval="20s")
            result = _range(prom, q, t0, t1)
            values = [float(v) for series in result for _, v in series["values"]]
            finite = [v for v in values if math.isfinite(v)]
            checked.append((dash, title))
            if not finite:
                missing.append(f"{dash} / {title}: {q}")
        assert not missing, "dashboard queries without data:\n" + "\n".join(missing)
        # what was checked live: all of the generation dashboard's draftsmith and vLLM panels, and serving's load
        gen_live = {t for d, t in checked if d == "generation"}
        assert {"Progress (prompts done / total)", "ETA", "Completed requests / s", "Output tokens / s",
                "Requests in flight", "Request latency p50 / p95", "Errors by reason (/ s)", "Queue depth",
                "Workers alive"} <= gen_live
        assert {"Running and waiting requests", "KV-cache use", "Engine output tokens / s"} <= {
            t for d, t in checked if d == "serving"}
        # and the numbers are the run's: 5 answers and 1 context-length error
        ok = _range(prom, f'max(draftsmith_generation_requests_total{{run="{run}",outcome="ok"}})', t1 - 2, t1)
        err = _range(prom, f'max(draftsmith_generation_errors_total{{run="{run}",reason="context_length"}})',
                     t1 - 2, t1)
        assert float(ok[0]["values"][-1][1]) == 5.0 and float(err[0]["values"][-1][1]) == 1.0
    finally:
        for p in reversed(procs):
            _stop(p)

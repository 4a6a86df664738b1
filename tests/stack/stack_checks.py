"""What any run of the Compose stack must show, whichever target it serves (tests/stack/test_runbook.py runs them).

- a generator container SIGKILLed while it holds a job: the job completes in another container (rq hands an
  abandoned job back once its heartbeat lapses), nothing lost or duplicated (:func:`busy_generator`,
  :func:`record_counts`);
- Prometheus: every scrape target up, every dashboard query that a healthy run feeds answered
  (:func:`check_prometheus`; Grafana itself has no image here, its dashboards are the PromQL it would send);
- `make down` then `make up`: the queue and the runs survive on their volumes, nothing is redone
  (:func:`work_mtimes`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis as redis_lib
from stack_helpers import concrete, dashboard_queries, promql_metric_names

# dashboard sources a stack run feeds, by metric-name prefix. Not live here: the trainer's metrics (its one-off
# container lives about a minute; the training dashboard is checked by name in test_dashboards.py), and the counters
# of events that do not happen in a healthy run (generation errors, samples skipped by extraction).
LIVE = ("draftsmith_generation_", "draftsmith_queue_", "draftsmith_workers_", "draftsmith_extract_",
        "draftsmith_eval_", "vllm:")
NOT_LIVE = ("draftsmith_generation_errors_total", "draftsmith_extract_skipped_samples_total",
            "draftsmith_eval_speedup")  # speedup needs a second server without the drafter; the stack has one target
# the serving dashboard's sources once `make serve` ran a refresh cycle; not live: masking (the bundled prompts hold
# nothing that looks like a secret)
SERVING_LIVE = ("draftsmith_gateway_", "draftsmith_canary_", "draftsmith_serving_", "draftsmith_refresh_")
SERVING_NOT_LIVE = ("draftsmith_gateway_masked_total",)
# what a stage that ran again would rewrite, under runs/<run>/
WORK = ("records", "data", "features", "checkpoints", "export")


def wait_for(cond: Callable[[], bool], timeout: float, every: float = 2.0, what: str = "") -> None:
    """Poll ``cond`` every ``every`` seconds until it is true; fail the test after ``timeout`` seconds."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def record_counts(runs: Path, run: str) -> Counter:
    """How many generation records each prompt id has in ``runs/<run>/records`` (empty before the first)."""
    from draftsmith.generation.store import iter_records

    folder = runs / run / "records"
    return Counter(r["id"] for r in iter_records(folder)) if folder.is_dir() else Counter()


def redis_client(env_file: Path, port: int) -> redis_lib.Redis:
    """A client of the stack's Redis, published on 127.0.0.1:``port``, with the password of ``env_file``."""
    pw = next(line.split("=", 1)[1] for line in env_file.read_text().splitlines()
              if line.startswith("REDIS_PASSWORD="))
    return redis_lib.Redis(host="127.0.0.1", port=port, password=pw)


def busy_generator(r: redis_lib.Redis, containers: dict[str, str], timeout: float = 300) -> str:
    """Name of a generator container that runs a job now (rq's started registry and worker hashes).

    ``containers`` maps the 12-character container id (the worker's hostname) to its name. Fails the test when no
    generator container holds a job within ``timeout`` seconds.
    """
    from rq.registry import StartedJobRegistry
    from rq.serializers import JSONSerializer
    from rq.worker import Worker

    found: list[str] = []

    def busy() -> bool:
        reg = StartedJobRegistry("draftsmith:generate", connection=r, serializer=JSONSerializer)
        for job_id in reg.get_job_ids(cleanup=False):
            for w in Worker.all(connection=r, serializer=JSONSerializer):
                if w.get_current_job_id() == job_id and (w.hostname or "")[:12] in containers:
                    found.append(containers[w.hostname[:12]])
                    return True
        return False

    wait_for(busy, timeout, 0.5, "a generator container running a job")
    return found[0]


def work_mtimes(run_dir: Path) -> dict[Path, int]:
    """Modification time (ns) of every file a stage that ran again would rewrite (:data:`WORK`)."""
    return {p: p.stat().st_mtime_ns for d in WORK for p in (run_dir / d).rglob("*") if p.is_file()}


def check_prometheus(prom: str) -> None:
    """Every active scrape target of the Prometheus at ``prom`` up; every live dashboard query (:data:`LIVE`, less
    :data:`NOT_LIVE`) returns at least one series over the last 30 minutes."""
    jobs = scrape_jobs_up(prom)
    assert {"target", "generator", "extractor", "queue-exporter", "evaluator", "prometheus"} <= jobs, jobs
    # the evaluator's gauges reach Prometheus at the Pushgateway's next scrape (15 s) after the job pushed them
    queries_have_data(prom, LIVE, NOT_LIVE, at_least=30)


def check_serving_queries(prom: str) -> None:
    """After `make serve` and one refresh cycle: the gateway and refresh services scraped and up, and every
    serving-dashboard query of the gateway, the canary and the refresh loop (:data:`SERVING_LIVE`) with data."""
    jobs = scrape_jobs_up(prom)
    assert {"gateway", "refresh"} <= jobs, jobs
    queries_have_data(prom, SERVING_LIVE, SERVING_NOT_LIVE, at_least=8)


def scrape_jobs_up(prom: str) -> set[str]:
    """The jobs of the active scrape targets, once every one of them is up (waits up to 120 s)."""
    def all_up() -> bool:
        targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_for(all_up, 120, 2, "every Prometheus scrape target up")
    targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["job"] for t in targets}


def queries_have_data(prom: str, live: tuple[str, ...], not_live: tuple[str, ...], at_least: int) -> None:
    """Every dashboard query whose metrics all start with ``live`` (and none with ``not_live``) returns at least
    one series over the last 30 minutes, within 90 s (a scrape or two after the metric appeared)."""
    queries = []
    for dashboard, title, expr in dashboard_queries():
        names = {n for n in promql_metric_names(expr) if not n.startswith("sglang:")}  # SGLang: another engine
        if names and all(n.startswith(live) and not n.startswith(not_live) for n in names):
            queries.append((dashboard, title, sorted(names), concrete(expr, run_regex=".*", rate_interval="2m")))
    assert len(queries) >= at_least, len(queries)

    def without_data() -> list:
        end, empty = time.time(), []
        for dashboard, title, names, q in queries:
            body = httpx.get(f"{prom}/api/v1/query_range", params={"query": q, "start": end - 1800, "end": end,
                                                                  "step": "15s"}, timeout=30).json()
            assert body["status"] == "success", (dashboard, title, body)
            if not body["data"]["result"]:
                empty.append((dashboard, title, names))
        return empty

    t0 = time.time()
    while (empty := without_data()) and time.time() - t0 < 90:
        time.sleep(5)
    assert not empty, f"dashboard queries without data: {empty}"

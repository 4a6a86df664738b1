"""The Compose stack, run for real the way the README tells a user without GPU: `make up ENGINE=cpu`.

Part of `make test` (`make test-stack` runs it alone). Real containers: podman behind its Docker-compatible API,
driven by docker-compose 1.29 (scripts/podman-host.sh installs and starts them where no Docker engine runs); real
images built here without a registry (scripts/local-images.sh: Debian stand-ins for Python, Redis, Prometheus and
Pushgateway; 4 to 9 minutes cold on the 2-core CI machines, podman's install included); the real SmolLM2 target on vLLM's CPU build inside the
project image. Every step is a make target of the README, with a `.env` made from `.env.example` and generated
secrets. Grafana cannot run here (no registry or Debian package ships it): the stack starts with
`--scale grafana=0`, and each dashboard query is evaluated against the stack's own Prometheus instead.

One test, in order (a step's failure names the step): up; enqueue + status until done, one record per prompt; a
generator container SIGKILLed mid-batch, nothing lost or duplicated; build-data and extract (exec in the stack);
train (tiny) in the trainer's one-off container, export, the target restarted with the drafter and eval in the
evaluator's one-off container (acceptance measured by vLLM); Prometheus targets all up and the dashboards' queries
answered; down + up: the queue and the runs survive, nothing is redone. Afterwards nothing of the project is left
(containers, volumes, network).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis as redis_lib
from draftsmith.generation.store import iter_records
from draftsmith.target.server import free_port
from stack_helpers import REPO, concrete, dashboard_queries, promql_metric_names, record_phase

pytestmark = [pytest.mark.slow]
PROJECT = "dsstack"
RUN = "stack"
PROMPTS = 32
# the Docker CLI (through podman's API where no Docker engine runs), else podman's own, which takes the same arguments
DOCKER = "docker" if shutil.which("docker") else "podman"
UID = 1000  # the image's user (build arg UID): the host folders it writes must be its own
# dashboard sources this test runs, by metric-name prefix. Not live here: the trainer's metrics (its one-off container
# lives about a minute; the training dashboard is checked by name in test_dashboards.py), and the counters of events
# that do not happen in a healthy run (generation errors, samples skipped by extraction).
LIVE = ("draftsmith_generation_", "draftsmith_queue_", "draftsmith_workers_", "draftsmith_extract_",
        "draftsmith_eval_", "vllm:")
NOT_LIVE = ("draftsmith_generation_errors_total", "draftsmith_extract_skipped_samples_total",
            "draftsmith_eval_speedup")  # speedup needs a second server without the drafter; the stack has one target


def sh(cmd: list[str], env: dict[str, str], timeout: float = 900, check: bool = True) -> str:
    """Run a user command from the repository root; fail with its output tail when it fails."""
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{out[-3000:]}"
    return out


def wait_for(cond, timeout: float, every: float = 2.0, what: str = "") -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def records(runs: Path, run: str) -> Counter:
    return Counter(r["id"] for r in iter_records(runs / run / "records"))


def make_env_file(tmp: Path, ports: dict[str, int]) -> Path:
    """.env from .env.example with generated secrets and the cpu profile's values, as the README says."""
    values = {
        "COMPOSE_PROJECT_NAME": PROJECT,
        "REDIS_PASSWORD": secrets.token_hex(24), "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(16),
        "TARGET_MODEL": "SmolLM2-135M-Instruct", "TORCH_VARIANT": "cpu", "TENSOR_PARALLEL_SIZE": "1",
        "MAX_MODEL_LEN": "2048", "CPU_KV_CACHE_GIB": "1",
        "MODELS_DIR": str(tmp / "models"), "RUNS_DIR": str(tmp / "runs"), "PROMPTS_DIR": str(REPO / "data"),
        "DRAFTSMITH_RUN": RUN, "GENERATOR_PROCESSES": "2", "GENERATOR_CONCURRENCY": "8",
        "EXTRACT_BACKEND": "hf",  # the vllm backend in the stack: tests/stack/test_runbook.py
        **{k: str(v) for k, v in ports.items()},
    }
    lines = []
    for line in (REPO / ".env.example").read_text().splitlines():
        key = line.partition("=")[0].strip()
        lines.append(f"{key}={values.pop(key)}" if key in values and not line.startswith("#") else line)
    lines += [f"{k}={v}" for k, v in values.items()]
    p = tmp / ".env"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Engine (podman where no Docker runs), images, `.env`; afterwards the stack, its volumes and network go."""
    tmp = tmp_path_factory.mktemp("stack")
    for d in ("runs", "models"):
        (tmp / d).mkdir()
        os.chown(tmp / d, UID, UID)
    ticker = Path("/run/draftsmith-podman/health-ticker.pid")
    started_engine = not ticker.exists()
    t0 = time.time()
    out = sh(["scripts/podman-host.sh", "start"], dict(os.environ), timeout=900)
    record_phase("podman engine (stack test)", time.time() - t0)
    env = dict(os.environ)
    for line in out.splitlines():
        if line.startswith("export DOCKER_HOST="):
            env["DOCKER_HOST"] = line.split("=", 1)[1]
    ports = {"REDIS_PORT": free_port(), "PROMETHEUS_PORT": free_port(), "TARGET_PORT": free_port(),
             "GRAFANA_PORT": free_port()}
    env_file = make_env_file(tmp, ports)
    for k in list(env):  # the .env is the configuration, not this process's environment
        if k.startswith("DRAFTSMITH_"):
            del env[k]
    t0 = time.time()
    sh(["make", "-s", "images", f"ENV_FILE={env_file}"], env, timeout=1800)
    images_s = time.time() - t0
    record_phase("images (stack test)", images_s)
    mk = ["make", "-s", f"ENV_FILE={env_file}", f"PROJECT={PROJECT}", "ENGINE=cpu", f"RUN={RUN}"]
    ctx = {"tmp": tmp, "env": env, "env_file": env_file, "ports": ports, "make": mk, "images_s": images_s,
           "runs": tmp / "runs"}
    try:
        yield ctx
    finally:
        teardown(env, env_file)
        if started_engine:
            sh(["scripts/podman-host.sh", "stop"], env, check=False)


def teardown(env: dict[str, str], env_file: Path) -> None:
    """`down -v`, then remove whatever of the project survived it and fail if anything is still there.

    A container in its restart back-off when `down` lists the project can come back after `down` (seen here with
    podman 4.3: an extractor looping on a Redis it could not resolve outlived `down -v` with the volumes).
    """
    v2 = DOCKER == "docker" and subprocess.run(["docker", "compose", "version"], capture_output=True, env=env)
    cli = ["docker", "compose"] if v2 and v2.returncode == 0 else ["docker-compose"]
    base = [*cli, "-p", PROJECT, "--env-file", str(env_file), "-f", "compose.yaml"]
    profiles = [a for p in ("cpu", "train", "eval") for a in ("--profile", p)]
    sh([*base, *profiles, "down", "-v", "--remove-orphans", "-t", "20"], env, check=False, timeout=300)
    label = f"label=com.docker.compose.project={PROJECT}"
    left = {}
    for _ in range(3):
        left = {kind: sh([DOCKER, *cmd, "-q", "--filter", label], env, check=False).split()
                for kind, cmd in (("container", ["ps", "-a"]), ("volume", ["volume", "ls"]),
                                  ("network", ["network", "ls"]))}
        if not any(left.values()):
            return
        for kind, ids in left.items():
            if ids:
                sh([DOCKER, kind, "rm", "-f", *ids], env, check=False)
    assert not any(left.values()), f"the stack left these behind after down -v: {left}"


def up(ctx) -> None:
    sh([*ctx["make"], "up", "BUILD=", "UP_ARGS=--scale grafana=0 --scale generator=2"], ctx["env"], timeout=900)
    target = f"http://127.0.0.1:{ctx['ports']['TARGET_PORT']}/health"

    def healthy() -> bool:
        try:
            return httpx.get(target, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 900, 5, "the target container (vLLM CPU) to answer /health")


def redis_client(ctx) -> redis_lib.Redis:
    pw = next(line.split("=", 1)[1] for line in ctx["env_file"].read_text().splitlines()
              if line.startswith("REDIS_PASSWORD="))
    return redis_lib.Redis(host="127.0.0.1", port=ctx["ports"]["REDIS_PORT"], password=pw)


@pytest.mark.timeout(3600)
def test_stack_cpu_end_to_end(stack):
    ctx, env, mk, runs = stack, stack["env"], stack["make"], stack["runs"]
    print(f"images: {ctx['images_s']:.0f} s")
    mark = [time.time()]

    def done(step: str) -> None:  # each step's wall time, into CI's phase table
        record_phase(f"stack: {step}", time.time() - mark[0])
        mark[0] = time.time()

    # 1. up: redis, target-cpu, two generators, extractor, queue-exporter, pushgateway, prometheus
    t0 = time.time()
    up(ctx)
    print(f"up + target healthy: {time.time() - t0:.0f} s")

    # 2. a few dozen prompts through the generator pool; `make status` until done; one record per prompt on disk
    out = sh([*mk, "enqueue", f"LIMIT={PROMPTS}", "MAX_TOKENS=32", "BATCH=4"], env)
    assert f"Pending: {PROMPTS}" in out, out[-2000:]
    wait_for(lambda: sum(records(runs, RUN).values()) >= PROMPTS, 900, 5, "the generation records")
    status = sh([*mk, "status"], env)
    assert RUN in status and "done" in status, status[-2000:]
    recs = records(runs, RUN)
    assert len(recs) == PROMPTS and set(recs.values()) == {1}, recs
    print(f"generation of {PROMPTS} prompts: {time.time() - t0:.0f} s since up")
    done("up, generation")

    # 3. a generator container SIGKILLed while it holds a batch: the batch completes in the other one (rq retries
    #    the abandoned job once its heartbeat lapses), nothing lost or duplicated
    r = redis_client(ctx)
    kill_run = "kill"
    out = sh([*mk, "enqueue", f"RUN={kill_run}", "LIMIT=24", "MAX_TOKENS=96", "BATCH=4"], env)
    assert "Pending: 24" in out, out[-2000:]
    victim = wait_busy_generator(ctx, r)
    sh([DOCKER, "kill", "--signal", "KILL", victim], env)
    print(f"SIGKILLed generator container {victim} mid-batch")
    wait_for(lambda: sum(records(runs, kill_run).values()) >= 24, 900, 5, "the killed container's batch elsewhere")
    recs = records(runs, kill_run)
    assert len(recs) == 24 and set(recs.values()) == {1}, recs
    up(ctx)  # `docker kill` counts as a manual stop (no restart policy applies): make up brings it back
    done("generator killed, batch redone")

    # 4. build-data and extract through the stack's services
    sh([*mk, "data"], env)
    assert list((runs / RUN / "data").rglob("*.safetensors")), "build-data wrote no shard"
    sh([*mk, "extract", "JOB_ENV=-e DRAFTSMITH_EXTRACT__LAYERS=[1,14,26]"], env)
    wait_for(lambda: extraction_done(runs / RUN), 900, 5, "the extractor container's feature shards")
    done("data, extract")

    # 5. train (tiny) in the trainer's one-off container, export in the generator, then serve the drafter
    #    (DRAFTER_DIR in .env, make up recreates the target) and measure its acceptance in the evaluator's container
    t0 = time.time()
    sh([*mk, "train", "JOB_ENV=-e DRAFTSMITH_TRAIN__MAX_STEPS=12 -e DRAFTSMITH_TRAIN__EVAL_EVERY=6 "
                "-e DRAFTSMITH_TRAIN__BATCH_TOKENS=1024 -e DRAFTSMITH_TRAIN__TTT_STEPS=3"], env, timeout=1200)
    assert list((runs / RUN / "checkpoints").glob("*/model.safetensors")), "train wrote no checkpoint"
    sh([*mk, "export"], env)
    assert (runs / RUN / "export" / "eagle3" / "config.json").is_file(), "export wrote no eagle3 layout"
    print(f"train + export: {time.time() - t0:.0f} s")
    done("train, export")
    set_env(ctx["env_file"], "DRAFTER_DIR", f"/runs/{RUN}/export/eagle3")
    up(ctx)
    sh([*mk, "eval", "JOB_ENV=-e DRAFTSMITH_EVAL__LIMIT=2 -e DRAFTSMITH_EVAL__BASELINE=false "
        "-e DRAFTSMITH_EVAL__MAX_TOKENS=32"], env, timeout=1200)
    import json

    report = json.loads((runs / RUN / "eval" / "report.json").read_text())
    overall = report["results"][0]["overall"]
    # a 12-step drafter proposes little that the target accepts: the test asserts that the served drafter drafted
    # (vLLM's spec-decode counters moved), not its quality (that is the demo's job)
    assert report["results"][0]["engine"] == "vllm" and report["k"] == 3, report["results"][0]
    assert overall["acceptance_rate"] is not None and 1.0 <= overall["mean_acceptance_length"] <= 4.0, overall
    print(f"eval: mean acceptance length {overall['mean_acceptance_length']:.2f}; {time.time() - t0:.0f} s")
    done("drafter served, eval")

    # 6. Prometheus (the stack's own): every scrape target up, every dashboard query answered
    prom = f"http://127.0.0.1:{ctx['ports']['PROMETHEUS_PORT']}"
    check_prometheus(prom)
    done("prometheus queries")

    # 7. down, up: the queue and the runs survive on their volumes; nothing is redone
    work = ("records", "data", "features", "checkpoints", "export")  # what a redone stage would rewrite
    before = {p: p.stat().st_mtime_ns for d in work for p in (runs / RUN / d).rglob("*") if p.is_file()}
    assert any("features" in p.parts for p in before) and any("records" in p.parts for p in before)
    sh([*mk, "down"], env, timeout=600)
    up(ctx)
    r = redis_client(ctx)
    assert r.exists(f"draftsmith:progress:{RUN}") or r.keys("draftsmith*"), "Redis lost its data across down/up"
    out = sh([*mk, "enqueue", f"LIMIT={PROMPTS}", "MAX_TOKENS=32", "BATCH=4"], env)
    assert "Pending: 0" in out, out[-2000:]
    out = sh([*mk, "extract"], env)
    assert "nothing to do" in out, out[-2000:]
    after = {p: p.stat().st_mtime_ns for p in before if p.exists()}
    changed = sorted(str(p.relative_to(runs)) for p in before if after.get(p) != before[p])
    assert not changed, f"files of the run were rewritten or removed after down/up: {changed}"
    done("down, up, nothing redone")


def set_env(env_file: Path, key: str, value: str) -> None:
    """Set KEY=VALUE in the .env, as a user edits it."""
    lines = [ln for ln in env_file.read_text().splitlines() if not ln.startswith(f"{key}=")]
    env_file.write_text("\n".join([*lines, f"{key}={value}"]) + "\n")


def wait_busy_generator(ctx, r: redis_lib.Redis) -> str:
    """Name of a generator container that is running a job now (from rq's started registry and worker hashes)."""
    from rq.registry import StartedJobRegistry
    from rq.serializers import JSONSerializer
    from rq.worker import Worker

    names = sh([DOCKER, "ps", "--format", "{{.ID}} {{.Names}}", "--filter", f"label=com.docker.compose.project="
                f"{PROJECT}", "--filter", "label=com.docker.compose.service=generator"], ctx["env"]).split("\n")
    by_id = {line.split()[0][:12]: line.split()[1] for line in names if line.strip()}
    found: list[str] = []

    def busy() -> bool:
        reg = StartedJobRegistry("draftsmith:generate", connection=r, serializer=JSONSerializer)
        for job_id in reg.get_job_ids(cleanup=False):
            for w in Worker.all(connection=r, serializer=JSONSerializer):
                if w.get_current_job_id() == job_id and (w.hostname or "")[:12] in by_id:
                    found.append(by_id[w.hostname[:12]])
                    return True
        return False

    wait_for(busy, 300, 0.5, "a generator container running a job")
    return found[0]


def extraction_done(root: Path) -> bool:
    import json

    f = root / "status" / "extract.json"
    if not f.is_file():
        return False
    snap = json.loads(f.read_text())
    return snap.get("shards_total", 0) > 0 and snap.get("shards_done") == snap.get("shards_total")


def check_prometheus(prom: str) -> None:
    """Every active scrape target up; every dashboard query returns at least one series over the last 30 minutes.

    Grafana itself cannot run here; its dashboards are JSON whose PromQL is what it would send to this Prometheus.
    """
    def all_up() -> bool:
        targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_for(all_up, 120, 5, "every Prometheus scrape target up")
    targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    jobs = {t["labels"]["job"] for t in targets}
    assert {"target", "generator", "extractor", "queue-exporter", "evaluator", "prometheus"} <= jobs, jobs
    queries = []
    for dashboard, title, expr in dashboard_queries():
        names = {n for n in promql_metric_names(expr) if not n.startswith("sglang:")}  # SGLang: another engine
        if names and all(n.startswith(LIVE) and not n.startswith(NOT_LIVE) for n in names):
            queries.append((dashboard, title, sorted(names), concrete(expr, run_regex=".*", rate_interval="2m")))
    assert len(queries) >= 30, len(queries)

    def without_data() -> list:
        end, empty = time.time(), []
        for dashboard, title, names, q in queries:
            body = httpx.get(f"{prom}/api/v1/query_range", params={"query": q, "start": end - 1800, "end": end,
                                                                  "step": "15s"}, timeout=30).json()
            assert body["status"] == "success", (dashboard, title, body)
            if not body["data"]["result"]:
                empty.append((dashboard, title, names))
        return empty

    # the evaluator's gauges reach Prometheus at the Pushgateway's next scrape (15 s) after the job pushed them
    t0 = time.time()
    while (empty := without_data()) and time.time() - t0 < 90:
        time.sleep(10)
    assert not empty, f"dashboard queries without data: {empty}"

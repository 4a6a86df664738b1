"""docs/gpu-host.md section 9 run as written on the CPU Compose stack, and the stack's own checks in the same run.

Part of `make test` (`make test-stack` runs it alone): the one test that brings the Compose stack up. Real
containers: podman behind its Docker-compatible API, driven by docker-compose 1.29 (scripts/podman-host.sh installs
and starts them where no Docker engine runs); real images built here without a registry (`make images`,
scripts/local-images.sh). The `.env` lines and the commands are read from the doc's marked blocks
(tests/stack/runbook.py); what a CPU runs instead comes from the table beside them, never from editing a command.
Real parts throughout: the tiny target in Kimi-K2.5's checkpoint layout (`draftsmith target make-tiny-kimi`: its
own tokenizer code, MLA + MoE) served by vLLM's CPU build in the `cpu` profile's target (`make up` with
`ENGINE=cpu`, the README's CPU path); two generator containers; build-data in the generator container; the
extractor on the `vllm` backend split over 2 tensor-parallel rank processes, as `.env` says; the trainer's one-off
container fine-tuning from a drafter of another draft vocabulary (remapped, the overlap logged) with its rope
adapted; the target restarted with the drafter and acceptance measured by vLLM in the evaluator; then the engine
switch of the runbook's last line (`ENGINE=vllm`: `make up` stops the `cpu` target first and starts `target-vllm`,
the project image's vLLM CPU build standing in for the official image) and the measurement again.

The stack's own checks (tests/stack/stack_checks.py) ride on the same run: a generator container SIGKILLed while
it holds the run's generation job, the job done by the other container with nothing lost or duplicated; every
Prometheus target up and every dashboard query answered; `make down` then the README's `make up ENGINE=cpu`, the
queue and the run surviving and nothing redone; then the serving loop on the run (`make serve`: the gateway with
capture on and the refresh service, one refresh cycle from traffic sent through the gateway, its canary's decision
read back from the run, the routes and Prometheus). Afterwards nothing of the project is left (containers, volumes,
network). Grafana cannot run here (no registry or Debian package ships it): the stack starts with
`--scale grafana=0`, and each dashboard query is evaluated against the stack's own Prometheus instead.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from draftsmith.target.server import free_port
from prometheus_client.parser import text_string_to_metric_families
from runbook import runbook
from stack_checks import (
    busy_generator,
    check_prometheus,
    check_serving_queries,
    record_counts,
    redis_client,
    wait_for,
    work_mtimes,
)
from stack_helpers import REPO, record_phase

pytestmark = [pytest.mark.slow]
PROJECT = "dsrunbook"
RUN = "kimi"  # the runbook's RUN=
PROMPTS = 16  # LIMIT in the CPU table
DOCKER = "docker" if shutil.which("docker") else "podman"
UID = 1000  # the image's user: the host folders it writes must be its own
TARGET = "Kimi-K2.5-tiny"  # TARGET_MODEL in the CPU table
FIXTURE = "Kimi-K2.5-tiny-Eagle3"  # the public drafter's stand-in (the CPU table's INIT_FROM)
FIXTURE_VOCAB = 768  # its draft vocabulary; the run builds 1,024


def sh(cmd: list[str] | str, env: dict[str, str], timeout: float = 1800, check: bool = True) -> str:
    """Run a command from the repository root (a string through bash, as typed); fail with its output tail."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else cmd
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    if check:
        assert p.returncode == 0, (
            f"{cmd if isinstance(cmd, str) else ' '.join(cmd)} exited {p.returncode}:\n{out[-4000:]}"
        )
    return out


def set_env(env_file: Path, key: str, line: str) -> None:
    """Put ``line`` (``KEY=value``, a comment after it kept) in place of KEY's line, or at the end: as a user edits."""
    lines = env_file.read_text().splitlines()
    at = [i for i, ln in enumerate(lines) if ln.partition("=")[0].strip() == key and not ln.startswith("#")]
    if at:
        lines[at[-1]] = line
    else:
        lines.append(line)
    env_file.write_text("\n".join(lines) + "\n")


def compose_cli(env: dict[str, str]) -> str:
    """The Makefile's DOCKER_COMPOSE: the v2 plugin where Docker has it, else docker-compose 1.29."""
    v2 = (
        subprocess.run(["docker", "compose", "version"], capture_output=True, env=env)
        if DOCKER == "docker"
        else None
    )
    return "docker compose" if v2 is not None and v2.returncode == 0 else "docker-compose"


def tiny_kimi(models: Path, env: dict[str, str]) -> Path:
    """`draftsmith target make-tiny-kimi`'s folder copied to MODELS_DIR/<TARGET> (step 1's download, on a CPU)."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "draftsmith", "target", "make-tiny-kimi"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    src = Path(p.stdout.strip().splitlines()[-1])  # the folder (the log goes to stderr)
    dst = models / TARGET
    shutil.copytree(src, dst)
    return dst


def drafter_fixture(runs: Path, target: Path, out: Path) -> None:
    """A drafter of another draft vocabulary and rope than the run's, in the EAGLE-3 export layout: trained for two
    steps on the run's own features with a 768-token draft vocabulary, its rope theta set to the public Kimi-K2.5
    drafter's 1e6 (the public drafter cannot be downloaded here)."""
    from draftsmith.artifacts.data import vocab_dir
    from draftsmith.config import load_settings
    from draftsmith.data.vocab import write_draft_vocab
    from draftsmith.drafter.checkpoint import list_checkpoints
    from draftsmith.drafter.families.eagle3.export import export_checkpoint
    from draftsmith.drafter.trainer import Trainer

    scratch = out.parent / ".fixture-runs"
    for d in ("data", "features"):
        shutil.copytree(runs / RUN / d, scratch / "pub" / d)
    write_draft_vocab(vocab_dir(scratch / "pub" / "data"), FIXTURE_VOCAB)
    s = load_settings(
        None,
        {
            "runs_dir": str(scratch),
            "run": "pub",
            "target": {"path": str(target), "trust_remote_code": True},
            "train": {
                "draft_vocab_size": FIXTURE_VOCAB,
                "max_steps": 2,
                "ttt_steps": 2,
                "batch_size": 4,
                "batch_tokens": 1024,
                "precision": "fp32",
            },
        },
    )
    Trainer(s).run()
    export_checkpoint(
        list_checkpoints(scratch / "pub" / "checkpoints")[-1], str(target), scratch / "export", "eagle3"
    )
    shutil.copytree(scratch / "export" / "eagle3", out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(
        rope_theta=1000000.0, rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    )
    (out / "config.json").write_text(json.dumps(cfg))
    shutil.rmtree(scratch)
    for p in [out, *out.rglob("*")]:
        os.chown(p, UID, UID)


def extraction_done(root: Path) -> bool:
    f = root / "status" / "extract.json"
    if not f.is_file():
        return False
    snap = json.loads(f.read_text())
    return snap.get("shards_total", 0) > 0 and snap.get("shards_done") == snap.get("shards_total")


def job_failed(ctx) -> bool:
    """True when the extractor logged a failed job (the run's status does not say; its log does)."""
    logs = sh(f"{ctx['compose']} logs --no-color extractor", ctx["env"], check=False)
    return "ERROR draftsmith.jobqueue.worker: job extract-" in logs


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Engine, images, the tiny target, `.env` from .env.example + section 3's host lines; afterwards nothing left."""
    tmp = tmp_path_factory.mktemp("runbook")
    for d in ("runs", "models"):
        (tmp / d).mkdir()
        os.chown(tmp / d, UID, UID)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")
    }  # .env is the configuration
    if os.environ.get("TEST_DRAFTSMITH_CACHE"):
        env["DRAFTSMITH_TARGET__CACHE_DIR"] = os.environ["TEST_DRAFTSMITH_CACHE"]
    env["DRAFTSMITH_PROMPTS_DIR"] = str(REPO / "data" / "prompts")
    t0 = time.time()
    target = tiny_kimi(tmp / "models", env)
    for p in [target, *target.rglob("*")]:
        os.chown(p, UID, UID)
    record_phase("tiny Kimi target (runbook)", time.time() - t0)
    env.pop("DRAFTSMITH_TARGET__CACHE_DIR", None)
    env.pop("DRAFTSMITH_PROMPTS_DIR", None)
    started_engine = not Path("/run/draftsmith-podman/health-ticker.pid").exists()
    out = sh(["scripts/podman-host.sh", "start"], env, timeout=900)
    for line in out.splitlines():
        if line.startswith("export DOCKER_HOST="):
            env["DOCKER_HOST"] = line.split("=", 1)[1]
    compose = f"{compose_cli(env)} -p {PROJECT} --env-file {tmp / '.env'} -f compose.yaml"
    try:
        yield from _stack(tmp, env, compose)
    finally:
        teardown(env, compose)
        if started_engine:
            sh(["scripts/podman-host.sh", "stop"], env, check=False)


def _stack(tmp: Path, env: dict[str, str], compose: str):
    """`.env` (from .env.example and section 3's host lines) and the images; yields the test's context."""
    ports = {
        "REDIS_PORT": free_port(),
        "PROMETHEUS_PORT": free_port(),
        "TARGET_PORT": free_port(),
        "GRAFANA_PORT": free_port(),
        "GATEWAY_PORT": free_port(),
    }
    env_file = tmp / ".env"
    shutil.copy(REPO / ".env.example", env_file)  # cp .env.example .env, then the host's lines (section 3)
    host = {
        "COMPOSE_PROJECT_NAME": PROJECT,
        "REDIS_PASSWORD": secrets.token_hex(24),
        "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(16),
        "TORCH_VARIANT": "cpu",
        "CPU_KV_CACHE_GIB": "1",
        "MODELS_DIR": str(tmp / "models"),
        "RUNS_DIR": str(tmp / "runs"),
        "PROMPTS_DIR": str(REPO / "data"),
        "GENERATOR_PROCESSES": "1",  # one worker in each of the two generator containers (UP_ARGS below)
        **{k: str(v) for k, v in ports.items()},
    }
    for k, v in host.items():
        set_env(env_file, k, f"{k}={v}")
    t0 = time.time()
    sh(["make", "-s", "images", f"ENV_FILE={env_file}"], env, timeout=1800)
    record_phase("images (runbook test)", time.time() - t0)
    image = next(
        ln.split("=", 1)[1] for ln in env_file.read_text().splitlines() if ln.startswith("PROJECT_IMAGE=")
    )
    set_env(env_file, "VLLM_IMAGE", f"VLLM_IMAGE={image}:cpu")  # the project image's vLLM CPU build
    env.update(
        ENV_FILE=str(env_file),
        PROJECT=PROJECT,
        COMPOSE_FILES="-f compose.yaml",
        BUILD="",
        UP_ARGS="--scale grafana=0 --scale generator=2",  # two: one is SIGKILLed mid-job
        # `make enqueue`'s batch: the 16 prompts as four jobs, so that the run's progress moves job by job and the
        # surviving worker runs them one after the other (the generation dashboard's ETA and in-flight panels
        # need a few scrapes of it; one job of 16 ended between two)
        BATCH="4",
    )
    ctx = {
        "tmp": tmp,
        "env": env,
        "env_file": env_file,
        "ports": ports,
        "runs": tmp / "runs",
        "compose": compose,
    }
    yield ctx


def teardown(env: dict[str, str], compose: str) -> None:
    """`down -v` over every profile, then remove whatever of the project survived it; fail if anything is left."""
    profiles = " ".join(f"--profile {p}" for p in ("cpu", "vllm", "train", "eval", "serving"))
    sh(f"{compose} {profiles} down -v --remove-orphans -t 20", env, check=False, timeout=300)
    label = f"label=com.docker.compose.project={PROJECT}"
    left = {}
    for _ in range(3):
        left = {
            kind: sh([DOCKER, *cmd, "-q", "--filter", label], env, check=False).split()
            for kind, cmd in (
                ("container", ["ps", "-a"]),
                ("volume", ["volume", "ls"]),
                ("network", ["network", "ls"]),
            )
        }
        if not any(left.values()):
            return
        for kind, ids in left.items():
            if ids:
                sh([DOCKER, kind, "rm", "-f", *ids], env, check=False)
    assert not any(left.values()), f"the stack left these behind after down -v: {left}"


@pytest.mark.timeout(3600)
def test_the_seeds_runbook_runs_as_written_on_the_cpu_stack(stack):
    ctx, env, runs, env_file = stack, stack["env"], stack["runs"], stack["env_file"]
    env_lines, steps, rows = runbook({"compose": ctx["compose"]})
    for key, line in env_lines:  # section 9's `.env` lines, as pasted
        set_env(env_file, key, line)
    log, outputs = ctx["tmp"] / "runbook.log", []
    mark = [time.time()]
    for step in steps:
        if step.env_key:  # "# DRAFTER_DIR=... in .env, then:"
            set_env(env_file, step.env_key, f"{step.env_key}={step.env_value}")
            continue
        cmd = step.command
        if "DRAFTSMITH_TRAIN__INIT_FROM" in cmd:  # the public drafter's stand-in, before the fine-tune
            drafter_fixture(runs, ctx["tmp"] / "models" / TARGET, ctx["tmp"] / "models" / FIXTURE)
        out = sh(cmd, env)
        outputs.append((cmd, out))
        with log.open("a") as f:
            f.write(f"$ {cmd}\n{out}\n")
        if cmd.split("#")[0].strip() == "make up":  # the operator waits for the target (section 4)
            wait_for(lambda: healthy(ctx["ports"]["TARGET_PORT"]), 900, 2, "the target to answer /health")
        elif cmd.startswith("make enqueue"):
            assert f"Pending: {PROMPTS}" in out, out[-2000:]
            generation_survives_a_killed_generator(ctx)
        elif cmd.startswith("make extract"):
            wait_for(
                lambda: extraction_done(runs / RUN) or job_failed(ctx), 1200, 3, "the extractor's shards"
            )
            assert extraction_done(runs / RUN), sh(
                f"{ctx['compose']} logs --no-color --tail=60 extractor", env
            )
        elif cmd.startswith("make up && make eval"):
            report = json.loads((runs / RUN / "eval" / "report.json").read_text())
            outputs.append(("report", report))
        record_phase(
            f"runbook: {cmd.split()[0]} {cmd.split()[1] if len(cmd.split()) > 1 else ''}"[:26],
            time.time() - mark[0],
        )
        mark[0] = time.time()
    by = {}
    for cmd, out in outputs:
        by.setdefault(cmd.split("#")[0].strip() if cmd != "report" else "report", []).append(out)

    # generation: one record per prompt, and `make status` says it is done (it counts the answers cut at their
    # length limit apart)
    recs = record_counts(runs, RUN)
    assert len(recs) == PROMPTS and set(recs.values()) == {1}, recs
    status = by[f"make status RUN={RUN}"][0]
    assert RUN in status and "done" in status, status[-2000:]
    assert list((runs / RUN / "data").rglob("*.safetensors")), "build-data wrote no shard"
    # extraction ran on the extractor's own backend from .env: vLLM, split over 2 tensor-parallel ranks
    logs = sh(f"{ctx['compose']} logs --no-color extractor", env)
    assert "backend vllm" in logs and "tensor parallel 2" in logs, logs[-3000:]
    manifest = json.loads((runs / RUN / "features" / "manifest.json").read_text())
    assert manifest["backend"] == "vllm", manifest
    # the extractor freed the target after EXTRACT_RELEASE_IDLE_S with an empty queue
    assert "released target" in logs, logs[-3000:]
    # the fine-tune started from the drafter of another vocabulary: remapped, the overlap logged
    train_out = next(o for c, o in outputs if c.startswith("make train"))
    known = re.search(r"knows (\d+) of this run's 1024 draft tokens \(([\d.]+)%", train_out)
    assert known, train_out[-3000:]
    # the fixture's 768 most frequent tokens of the same data: all of them among the run's 1,024
    assert int(known.group(1)) == FIXTURE_VOCAB, known.group(0)
    print(f"remap: {known.group(0)}")
    assert list((runs / RUN / "checkpoints").glob("*/model.safetensors")), "train wrote no checkpoint"
    eagle = json.loads((runs / RUN / "export" / "eagle3" / "config.json").read_text())
    assert eagle["rope_theta"] == 1000000.0 and eagle["draft_vocab_size"] == 1024, eagle  # INIT_ROPE=drafter
    # acceptance measured in vLLM, twice: the cpu target, then target-vllm after the switch
    reports = by["report"]
    assert len(reports) == 2 and reports[0]["created_at"] != reports[1]["created_at"]  # measured twice
    for report in reports:
        res = report["results"][0]
        overall = res["overall"]
        assert res["engine"] == "vllm" and report["k"] == 3, res
        assert overall["drafts"] > 0 and overall["acceptance_rate"] is not None, overall
        assert 1.0 <= overall["mean_acceptance_length"] <= 4.0, overall
        print(
            f"acceptance in vLLM: rate {overall['acceptance_rate']:.3f}, mean length "
            f"{overall['mean_acceptance_length']:.2f} over {overall['drafts']} drafts"
        )
    # the engine switch: `make up` with ENGINE=vllm stopped the cpu target before it started target-vllm
    switch = [o for c, o in outputs if c.startswith("make up && make eval")][-1]
    assert "gpu-handover: stopping target-cpu first" in switch, switch[-3000:]
    running = sh(f"{ctx['compose']} --profile cpu --profile vllm ps --services --filter status=running", env)
    assert "target-vllm" in running.split() and "target-cpu" not in running.split(), running

    # the stack's own checks on the same run: Prometheus, then down and up with nothing redone
    mark[0] = time.time()
    check_prometheus(f"http://127.0.0.1:{ctx['ports']['PROMETHEUS_PORT']}")
    record_phase("stack: prometheus queries", time.time() - mark[0])
    mark[0] = time.time()
    enqueue = next(s.command for s in steps if s.command and s.command.startswith("make enqueue"))
    nothing_redone_after_down_and_up(ctx, enqueue)
    record_phase("stack: down, up, no redo", time.time() - mark[0])
    mark[0] = time.time()
    the_refresh_loop_serves_the_run(ctx)
    record_phase("stack: serve, refresh, canary", time.time() - mark[0])


def compose_containers(ctx, service: str) -> dict[str, str]:
    """``{12-character id: name}`` of the project's running containers of ``service``."""
    out = sh([DOCKER, "ps", "--format", "{{.ID}} {{.Names}}", "--filter",
              f"label=com.docker.compose.project={PROJECT}", "--filter",
              f"label=com.docker.compose.service={service}"], ctx["env"])
    return {line.split()[0][:12]: line.split()[1] for line in out.splitlines() if line.strip()}


def generation_survives_a_killed_generator(ctx) -> None:
    """SIGKILL the generator container that holds the run's job, right after `make enqueue`: the other container
    does the job once rq finds its heartbeat lapsed, one record per prompt, none lost or duplicated; then `make up`
    brings the killed container back (`docker kill` counts as a manual stop: no restart policy applies)."""
    env, runs = ctx["env"], ctx["runs"]
    r = redis_client(ctx["env_file"], ctx["ports"]["REDIS_PORT"])
    containers = compose_containers(ctx, "generator")
    assert len(containers) == 2, containers
    victim = busy_generator(r, containers)
    sh([DOCKER, "kill", "--signal", "KILL", victim], env)
    print(f"SIGKILLed generator container {victim} mid-job")
    wait_for(lambda: sum(record_counts(runs, RUN).values()) >= PROMPTS, 1200, 2,
             "one generation record per prompt, the killed container's job done by the other")
    recs = record_counts(runs, RUN)
    assert len(recs) == PROMPTS and set(recs.values()) == {1}, recs
    sh("make up", env)
    assert len(compose_containers(ctx, "generator")) == 2, "make up did not bring the killed generator back"
    wait_for(lambda: healthy(ctx["ports"]["TARGET_PORT"]), 900, 2, "the target to answer /health")


def nothing_redone_after_down_and_up(ctx, enqueue: str) -> None:
    """`make down`, then the README's `make up ENGINE=cpu`: Redis kept its data, the runbook's enqueue finds every
    prompt done, `make extract` has nothing to do, and no file a stage writes was rewritten or removed."""
    env, runs = ctx["env"], ctx["runs"]
    before = work_mtimes(runs / RUN)
    assert any("features" in p.parts for p in before) and any("records" in p.parts for p in before)
    sh("make down", env, timeout=600)
    sh("make up ENGINE=cpu", env)
    wait_for(lambda: healthy(ctx["ports"]["TARGET_PORT"]), 900, 2, "the target to answer /health after down/up")
    r = redis_client(ctx["env_file"], ctx["ports"]["REDIS_PORT"])
    assert r.exists(f"draftsmith:progress:{RUN}") or r.keys("draftsmith*"), "Redis lost its data across down/up"
    out = sh(enqueue, env)
    assert "Pending: 0" in out, out[-2000:]
    out = sh(f"make extract RUN={RUN}", env)
    assert "nothing to do" in out, out[-2000:]
    after = work_mtimes(runs / RUN)
    changed = sorted(str(p.relative_to(runs)) for p in before if after.get(p) != before[p])
    assert not changed, f"files of the run were rewritten or removed after down/up: {changed}"


def captured_answers(port: int) -> float:
    """The gateway's ``draftsmith_gateway_captured_total{kind="answered"}``, from its own /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "draftsmith_gateway_captured_total" and s.labels.get("kind") == "answered")


def the_refresh_loop_serves_the_run(ctx) -> None:
    """docs/serving.md's loop on the run the runbook made: `make serve` adopts the drafter the target serves as v1
    and starts the gateway (capture on) and the refresh service; chat traffic at the run's temperature goes through
    the gateway until enough answers are captured; the refresh loop builds, extracts and trains from v1 with the
    run's recorded recipe in its container, and the canary there (the candidate's vLLM CPU engine in the refresh
    container, reached by the gateway as http://refresh:<port>) promotes or rolls back v2; the decision is read
    from decisions.jsonl, the routes, and Prometheus (the serving dashboard's gateway, canary and refresh queries)."""
    env, runs, env_file, port = ctx["env"], ctx["runs"], ctx["env_file"], ctx["ports"]["GATEWAY_PORT"]
    for key, value in {"CAPTURE_ENABLED": "true", "CAPTURE_SAMPLE_RATE": "1", "REFRESH_MIN_NEW_RECORDS": "4",
                       "REFRESH_POLL_S": "5", "CANARY_MIN_REQUESTS": "4"}.items():
        set_env(env_file, key, f"{key}={value}")
    out = sh(f"make serve RUN={RUN}", env)
    assert f"v1 serves run {RUN} at http://target:8000" in out, out[-3000:]
    wait_for(lambda: healthy(port), 300, 2, "the gateway to pass /health through to the target")
    record = json.loads((runs / RUN / "run-settings.json").read_text())["sections"]
    temperature = record["generation"]["temperature"]  # captured answers count at the run's own temperature
    questions = [json.loads(line)["question"] for line in
                 (REPO / "data" / "prompts" / "gsm8k_train.jsonl").read_text().splitlines()[-40:]]
    sent = 0
    while captured_answers(port) < 4:  # about half of the tiny target's answers run into the length limit
        assert sent < len(questions), f"{sent} requests gave fewer than 4 finished answers to capture"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "target", "messages": [{"role": "user", "content": questions[sent]}],
            "temperature": temperature, "max_tokens": 256})
        assert r.status_code == 200, r.text[-2000:]
        sent += 1
    decisions = runs / RUN / "drafters" / "decisions.jsonl"
    def logs() -> str:
        return sh(f"{ctx['compose']} --profile serving logs --no-color refresh", env, check=False)
    def decided_or_failed() -> bool:
        if decisions.is_file() and decisions.read_text().strip():
            return True
        return any(s in logs() for s in ("refresh cycle failed", "nothing to refresh yet"))

    wait_for(decided_or_failed, 1200, 10, "the refresh loop's canary decision")
    assert decisions.is_file() and decisions.read_text().strip(), logs()
    decision = json.loads(decisions.read_text().splitlines()[-1])
    print(f"refresh after {sent} requests: {decision['decision']} {decision['candidate']} vs {decision['current']}, "
          f"ratio {decision['interval_ratio']:.3f} [{decision['interval_low']:.3f}, {decision['interval_high']:.3f}] "
          f"over {decision['requests']} requests, {decision['identical_outputs']} identical")
    assert (decision["candidate"], decision["current"], decision["requests"]) == ("v2", "v1", 4), decision
    assert decision["candidate_url"].startswith("http://refresh:"), decision
    prov = json.loads((runs / RUN / "drafters" / "v2" / "provenance.json").read_text())
    assert prov["from_version"] == "v1" and prov["records"]["traffic_answered"] >= 4, prov
    assert "continuing with the run's recorded" in logs(), logs()
    r = redis_client(env_file, ctx["ports"]["REDIS_PORT"])
    routes = json.loads(r.get(f"draftsmith:serving:{RUN}:routes"))
    if decision["decision"] == "promote":  # the refresh container's engine serves everyone now
        assert (routes["stable_drafter"], routes["stable"]) == ("v2", decision["candidate_url"]), routes
    else:
        assert (routes["stable_drafter"], routes["stable"]) == ("v1", "http://target:8000"), routes
    after = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
        "model": "target", "messages": [{"role": "user", "content": questions[0]}], "max_tokens": 16})
    assert after.status_code == 200, after.text[-2000:]
    check_serving_queries(f"http://127.0.0.1:{ctx['ports']['PROMETHEUS_PORT']}")

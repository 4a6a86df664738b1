"""The Makefile's developer targets work as `make help` describes them: `lint` fails on a finding and passes on
the repository, `help` describes every target and names the benchmarks `make bench` leaves out."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_lint_fails_on_a_broken_file_and_passes_on_the_repository(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import os\n\n\ndef f(x):\n    return undefined_name + x\n")
    r = make("lint", f"LINT_PATHS={broken}")
    assert r.returncode != 0
    assert "F401" in r.stdout and "F821" in r.stdout, r.stdout  # unused import, undefined name
    r = make("lint")
    assert r.returncode == 0, r.stdout + r.stderr


def test_help_describes_every_target_and_the_benchmarks_left_out():
    r = make("help")
    assert r.returncode == 0, r.stderr
    described = {line.split()[0] for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))
    assert targets <= described, targets - described
    in_bench = re.search(r"^BENCH_VENV = (.*?)(?<!\\)$", (REPO / "Makefile").read_text(), re.M | re.S).group(1)
    for bench in sorted(p.name for p in (REPO / "bench").glob("*.py")):
        if bench == "stub_target.py":  # a server the benchmarks start, not a benchmark
            continue
        assert bench in in_bench or f"  {bench}" in r.stdout, f"{bench} is neither in make bench nor in make help"


def _dry(target: str, env_file: Path, *args: str) -> str:
    """The command lines ``make -n TARGET`` would run with ``env_file`` as .env (nothing runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE", "EVAL_ENGINE", "TRAIN_GPUS")}
    p = subprocess.run(["make", "-n", target, f"ENV_FILE={env_file}", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_eval_engine_and_train_gpus_follow_the_stack_unless_set(tmp_path):
    """``make eval`` measures the engine ``make up`` started and ``make train`` uses every GPU of the host, unless
    .env says otherwise (this machine has no GPU: one rank)."""
    env_file = tmp_path / ".env"
    env_file.write_text("ENGINE=sglang\nEVAL_ENGINE=\nTRAIN_GPUS=\n")
    assert "--engine sglang --url http://target:8000" in _dry("eval", env_file)
    assert "--engine vllm" in _dry("eval", env_file, "ENGINE=cpu")
    assert "draftsmith train-launch --nproc-per-node 1" in _dry("train", env_file)
    assert "--profile sglang up" in _dry("up", env_file)
    env_file.write_text("ENGINE=sglang\nEVAL_ENGINE=vllm\nTRAIN_GPUS=4\n")
    assert "--engine vllm" in _dry("eval", env_file)
    assert "draftsmith train-launch --nproc-per-node 4" in _dry("train", env_file)

"""`scripts/check-secrets.sh` refuses weak or shared secrets with one line and exit code 2 (the script runs for real)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOOD_REDIS, GOOD_GRAFANA = "3f9c1a7e5b2d4c6e8a0b1c2d", "9b8a7c6d5e4f3a2b"


def _check(tmp_path: Path, redis: str, grafana: str) -> subprocess.CompletedProcess:
    env_file = tmp_path / "t.env"
    env_file.write_text(f"REDIS_PASSWORD={redis}\nGRAFANA_ADMIN_PASSWORD={grafana}\nTARGET_MODEL=m\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "TARGET_MODEL")}
    return subprocess.run(["scripts/check-secrets.sh", str(env_file)], cwd=REPO, capture_output=True, text=True,
                          env=clean)


@pytest.mark.parametrize("weak", ["passwordpassword", "changeme1234", "aaaaaaaaaaaa", "PassWord2024xyz",
                                  "abcabcabcabc", "short1A", "121212121212xy"])
def test_weak_secret_is_refused(weak, tmp_path):
    for redis, grafana, name in ((weak, GOOD_GRAFANA, "REDIS_PASSWORD"), (GOOD_REDIS, weak, "GRAFANA_ADMIN_PASSWORD")):
        r = _check(tmp_path, redis, grafana)
        assert r.returncode == 2, (weak, r.stdout)
        assert r.stderr.startswith("error: weak secrets") and name in r.stderr and len(r.stderr.splitlines()) == 1


def test_the_same_password_for_both_secrets_is_refused(tmp_path):
    r = _check(tmp_path, GOOD_REDIS, GOOD_REDIS)
    assert r.returncode == 2 and "are the same" in r.stderr and len(r.stderr.splitlines()) == 1


def test_random_secrets_pass(tmp_path):
    r = _check(tmp_path, GOOD_REDIS, GOOD_GRAFANA)
    assert r.returncode == 0 and "secrets ok" in r.stdout, r.stderr

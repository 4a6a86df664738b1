"""Secrets (the target API key, the Redis password) stay in the process environment: masked in `config --show`,
written configs, manifests, checkpoints, error messages and logs; readers still get the plain value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

KEY = "sk-live-4f9a8b7c6d5e3a2b"
PASSWORD = "h7Kp2xQ9vLm4Tz8w"
REDIS = f"redis://:{PASSWORD}@127.0.0.1:1/2"  # port 1: nothing answers there


def _env(tmp_path, **extra):
    return {**os.environ, "DRAFTSMITH_TARGET__API_KEY": KEY, "DRAFTSMITH_REDIS__URL": REDIS,
            "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs"), **extra}


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_config_show_masks_secrets(tmp_path):
    r = _cli(["config", "--show"], _env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout and PASSWORD not in r.stdout
    assert "api_key: '**********'" in r.stdout and "url: redis://:**********@127.0.0.1:1/2" in r.stdout


def test_redis_error_message_hides_the_password(tmp_path):
    r = _cli(["enqueue", "--run", "x", "--source", "nothing.jsonl"], _env(tmp_path))
    assert r.returncode == 2 and PASSWORD not in r.stdout + r.stderr
    assert "error: Redis does not answer at redis://:**********@127.0.0.1:1/2" in r.stderr
    from draftsmith.errors import QueueError
    from draftsmith.jobqueue.queues import connect

    with pytest.raises(QueueError) as e:
        connect(REDIS)
    assert PASSWORD not in str(e.value) and "redis://:**********@127.0.0.1:1/2" in str(e.value)


def test_dumps_mask_and_readers_get_the_value():
    from draftsmith.config import load_settings, redact_url, secret_value, settings_to_yaml
    from draftsmith.target.server import auth_headers

    s = load_settings(None, {"target": {"api_key": KEY, "url": "http://bob:pw12345@10.0.0.1:8000"},
                             "redis": {"url": REDIS}})
    dumped = json.dumps(s.model_dump(mode="json")) + settings_to_yaml(s)  # what state.json / manifest / yaml hold
    assert KEY not in dumped and PASSWORD not in dumped and "pw12345" not in dumped
    assert s.redis.url == REDIS and secret_value(s.target.api_key) == KEY  # the live values
    assert auth_headers(s.target.api_key) == {"Authorization": f"Bearer {KEY}"}
    assert auth_headers(None) == {}
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("redis://default:abc@r:6379/0") == "redis://default:**********@r:6379/0"


def test_logs_mask_secrets_whoever_logs_them(tmp_path):
    code = (
        "import logging; from draftsmith.cli import settings\n"
        "settings()\n"
        f"logging.getLogger('rq.worker').info('job kwargs %s', {{'api_key': '{KEY}', 'url': '{REDIS}'}})\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "job kwargs" in r.stderr and KEY not in r.stderr and PASSWORD not in r.stderr

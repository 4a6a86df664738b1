"""``draftsmith build-data`` / ``draft-vocab`` through the CLI, and a live record from the real vLLM CPU server."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import write_records
from draftsmith.cli import app
from typer.testing import CliRunner

SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture
def run_env(tmp_path, monkeypatch, embedded_target):
    monkeypatch.setenv("DRAFTSMITH_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DRAFTSMITH_TARGET__PATH", str(embedded_target))
    return tmp_path / "runs" / "r1"


def test_build_check_and_rebuild_vocab(run_env, smollm2_records):
    write_records(run_env / "records", smollm2_records)
    runner = CliRunner()
    res = runner.invoke(app, ["build-data", "--run", "r1", "--check"])
    assert res.exit_code == 0, res.output
    assert "check ok: 4 turns token-exact of 3 records" in res.output
    assert not (run_env / "data" / "manifest.json").exists()
    res = runner.invoke(app, ["build-data", "--run", "r1", "--draft-vocab-size", "20", "--max-length", "128"])
    assert res.exit_code == 0, res.output
    assert "samples 3" in res.output and "token-exact 4/4" in res.output and "N=20" in res.output
    man = json.loads((run_env / "data" / "manifest.json").read_text())
    assert man["max_length"] == 128 and man["config"]["data"]["draft_vocab_size"] == 20
    res = runner.invoke(app, ["draft-vocab", "--run", "r1", "-n", "8", "-n", "30"])
    assert res.exit_code == 0, res.output
    for n in (8, 20, 30):
        meta = json.loads((run_env / "data" / "vocab" / f"draft-{n}.json").read_text())
        assert meta["size"] == n and meta["data_hash"] == man["data_hash"]


@pytest.mark.e2e
def test_live_two_turn_record_checks_prompt_ids(vllm_server, run_env, embedded_target):
    """Fresh greedy answers from the real vLLM CPU server (two turns), with generated and prompt token ids as
    served, validate token-exactly on both sides."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    turns = []
    for follow_up in ("Name another one.", None):
        body = {"model": SMOL, "messages": messages, "max_tokens": 16, "temperature": 0.0, "return_token_ids": True}
        t = time.monotonic()
        r = httpx.post(f"{vllm_server}/v1/chat/completions", json=body, timeout=300).json()
        c = r["choices"][0]
        messages = messages + [{"role": "assistant", "content": c["message"]["content"], "reasoning": None}]
        turns.append({"finish_reason": c["finish_reason"], "usage": r["usage"], "token_ids": c["token_ids"],
                      "prompt_token_ids": r["prompt_token_ids"], "reasoning_field": None,
                      "latency_s": time.monotonic() - t})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    rec = {"schema": "draftsmith.record/1", "id": "live", "status": "ok", "error": None, "model": r["model"],
           "messages": messages, "turns": turns, "sampling": {}, "job_id": "live", "created_at": "now"}
    write_records(run_env / "records", [rec])
    res = CliRunner().invoke(app, ["build-data", "--run", "r1", "--check"])
    assert res.exit_code == 0, res.output
    assert "check ok: 2 turns token-exact" in res.output and "prompts as served 2/2" in res.output


@pytest.mark.e2e
def test_live_server_record_is_token_exact(vllm_server, run_env, embedded_target):
    """One fresh greedy answer from the real vLLM CPU server, with its token ids, validates token-exactly."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    body = {"model": SMOL, "messages": messages, "max_tokens": 16, "temperature": 0.0, "return_token_ids": True}
    t = time.monotonic()
    r = httpx.post(f"{vllm_server}/v1/chat/completions", json=body, timeout=300).json()
    c = r["choices"][0]
    rec = {"schema": "draftsmith.record/1", "id": "live", "status": "ok", "error": None, "model": r["model"],
           "messages": messages + [{"role": "assistant", "content": c["message"]["content"], "reasoning": None}],
           "turns": [{"finish_reason": c["finish_reason"], "usage": r["usage"], "token_ids": c["token_ids"],
                      "reasoning_field": None, "latency_s": time.monotonic() - t}],
           "sampling": {}, "job_id": "live", "created_at": "now"}
    write_records(run_env / "records", [rec])
    res = CliRunner().invoke(app, ["build-data", "--run", "r1", "--check"])
    assert res.exit_code == 0, res.output
    assert "check ok: 1 turns token-exact" in res.output


def test_written_config_and_manifest_hold_no_secret(run_env, smollm2_records, monkeypatch):
    key, password = "sk-live-4f9a8b7c6d5e3a2b", "h7Kp2xQ9vLm4Tz8w"
    monkeypatch.setenv("DRAFTSMITH_TARGET__API_KEY", key)
    monkeypatch.setenv("DRAFTSMITH_REDIS__URL", f"redis://:{password}@127.0.0.1:6379/2")
    write_records(run_env / "records", smollm2_records)
    res = CliRunner().invoke(app, ["build-data", "--run", "r1", "--draft-vocab-size", "20", "--max-length", "128"])
    assert res.exit_code == 0, res.output
    for f in (run_env / "config.yaml", run_env / "data" / "manifest.json"):
        text = f.read_text()
        assert key not in text and password not in text, f
    man = json.loads((run_env / "data" / "manifest.json").read_text())
    assert man["config"]["target"]["api_key"] == "**********"
    assert man["config"]["redis"]["url"] == "redis://:**********@127.0.0.1:6379/2"

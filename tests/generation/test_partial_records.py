"""Partial records end to end on real processes: a real `draftsmith worker` answers a two-turn prompt on the real
SmolLM2 vLLM CPU server, whose second turn exceeds the context (a real 400 from vLLM); build-data keeps the good
first turn, and checks every prompt against the ``prompt_token_ids`` the server returned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from draftsmith.config import load_settings
from draftsmith.data.build import build_data
from draftsmith.generation.enqueue import enqueue
from draftsmith.generation.store import iter_records

SMOL = "SmolLM2-135M-Instruct"


@pytest.mark.e2e
def test_second_turn_over_the_context_keeps_the_first(tmp_path, redis_url, vllm_server, embedded_target):
    src = tmp_path / "mt.jsonl"
    src.write_text(json.dumps({"turns": ["Name a colour.", "word " * 5000]}) + "\n"
                   + json.dumps({"turns": ["Name a fruit.", "Name another one."]}) + "\n")
    s = load_settings(None, {"runs_dir": str(tmp_path / "runs"), "run": "t",
                             "redis": {"url": redis_url, "prefix": "dspartial"}, "target": {"url": vllm_server},
                             "generation": {"max_tokens": 16, "batch_size": 2, "backoff_s": 0.05}})
    enqueue(s, str(src), None, 2, say=lambda m: None)
    env = {**os.environ, "DRAFTSMITH_REDIS__URL": redis_url, "DRAFTSMITH_REDIS__PREFIX": "dspartial",
           "DRAFTSMITH_RUNS_DIR": str(s.runs_dir), "DRAFTSMITH_TARGET__URL": vllm_server}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "worker", "--burst", "--metrics-port", "0"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    records = Path(s.runs_dir) / "t" / "records"
    recs = {r["status"]: r for r in iter_records(records)}
    err = recs["error"]
    assert err["error"]["reason"] == "context_length" and err["error"]["turn"] == 1 and len(err["turns"]) == 1
    for r in recs.values():  # the server's own prompt ids are kept with every answered turn
        for t in r["turns"]:
            assert len(t["prompt_token_ids"]) == t["usage"]["prompt_tokens"]
    res = build_data(records, tmp_path / "data", embedded_target, s.data, SMOL)
    st = res.stats
    assert st["records"] == 2 and st["dropped"] == 0 and st["samples"] == 2
    assert st["flagged"]["partial_record"] == 1
    assert st["dropped_turns_by_reason"] == {"record_error:context_length": 1}
    assert st["turns_checked"] == 3 and st["turns_mismatched"] == 0
    assert st["prompts_checked"] == 3 and st["prompts_mismatched"] == 0

"""The seed's target family end to end: `draftsmith demo --size mla` on the tiny DeepSeek-V3 (MLA + MoE) target.

Real everything: the tiny target is built (and briefly trained) by `draftsmith target make-tiny-mla`, served by
vLLM CPU with its CPU_MLA backend and the deepseek_r1 reasoning parser, regenerates GSM8K prompts with reasoning
in its own thinking tokens through the rq worker pool, then build-data (token-exact), hf extraction, training,
export in both layouts and acceptance measured in vLLM CPU with the MLA target and the drafter loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_mla_target_through_every_stage(tmp_path, redis_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(DRAFTSMITH_REDIS__URL=redis_url, DRAFTSMITH_RUNS_DIR=str(tmp_path / "runs"),
               DRAFTSMITH_PROMPTS_DIR=str(Path(__file__).resolve().parents[1] / "data" / "prompts"),
               PYTHONPATH=str(REPO / "shared"))
    if os.environ.get("TEST_DRAFTSMITH_CACHE"):
        env["DRAFTSMITH_TARGET__CACHE_DIR"] = os.environ["TEST_DRAFTSMITH_CACHE"]
    p = subprocess.run([sys.executable, "-m", "draftsmith", "demo", "--size", "mla", "--run", "mla"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=1500)
    out = p.stdout + p.stderr
    (tmp_path / "demo.log").write_text(out)
    assert p.returncode == 0, out[-6000:]
    run = tmp_path / "runs" / "mla"
    assert "draftsmith demo report (size mla)" in out

    # generation: reasoning came back separately (the target's <think> ... </think>), with token ids
    recs = [json.loads(line) for f in sorted((run / "records").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(recs) == 32
    answers = [m for r in recs for m in r["messages"] if m["role"] == "assistant"]
    assert len(answers) == 32 and all(m["reasoning"] for m in answers)
    assert all(t["reasoning_field"] == "reasoning" and t["token_ids"] for r in recs for t in r["turns"])
    # the trained target closes its reasoning and ends (the 60-step recipe of version 1 ended none of 32): at least
    # half of the answers are complete, with the answer after </think> (content), not cut at max_tokens
    ended = [t for r in recs for t in r["turns"] if t.get("finish_reason") == "stop"]
    assert len(ended) >= 16, [t.get("finish_reason") for r in recs for t in r["turns"]]
    # vLLM's CPU MLA attention differs from transformers' on this target (docs/mla.md), so its greedy answers leave
    # the memorised text and how many still say "The answer is" varies from run to run (14 and 21 of 32 seen on the
    # Kimi-layout target, the same language model)
    assert sum("The answer is" in (m["content"] or "") for m in answers) >= 8, [m["content"] for m in answers]

    # build-data: every checked turn token-exact
    stats = json.loads((run / "data" / "stats.json").read_text())
    assert stats["turns_checked"] >= 16 and stats["turns_mismatched"] == 0, stats
    assert stats["reasoning_mode"] == "field"  # the template reads reasoning_content: <think> from the template

    # the exported drafter config was derived from the MLA config (head_dim = v_head_dim, not the rope part)
    target = json.loads((Path(json.loads((run / "export" / "speculators" / "config.json").read_text())
                              ["speculators_config"]["verifier"]["name_or_path"]) / "config.json").read_text())
    eagle = json.loads((run / "export" / "eagle3" / "config.json").read_text())
    assert target["model_type"] == "deepseek_v3" and target["kv_lora_rank"] == 512
    assert eagle["head_dim"] == target["v_head_dim"] != target["head_dim"]
    assert eagle["hidden_size"] == target["hidden_size"] and eagle["vocab_size"] == target["vocab_size"]
    assert eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]

    # acceptance measured in vLLM with the MLA target and the drafter loaded: the spec-decode counters moved
    report = json.loads((run / "eval" / "report.json").read_text())
    res = report["results"][0]
    assert res["engine"] == "vllm" and report["k"] == 3
    overall = res["overall"]
    assert overall["drafts"] > 0 and overall["draft_tokens"] > 0 and overall["accepted_tokens"] > 0
    assert 1.0 < overall["mean_acceptance_length"] <= 4.0
    gsm8k = res["sets"]["gsm8k"]
    assert gsm8k["draft_tokens"] > 0 and gsm8k["mean_acceptance_length"] is not None

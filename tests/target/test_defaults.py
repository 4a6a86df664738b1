"""Defaults from the target's own files: its recommended sampling, drop of cut answers for a reasoning target, the
request timeout from the lengths; each only where the config leaves the key unset.

The Qwen3 ``generation_config.json`` is the one published with Qwen/Qwen3-8B; the embedded SmolLM2 target's file
(no sampling keys) is the real prepared one.
"""

from __future__ import annotations

import json

import pytest
from draftsmith.config import load_settings
from draftsmith.generation.jobs import sampling_params
from draftsmith.target.defaults import (
    apply_data_defaults,
    apply_generation_defaults,
    derived_request_timeout_s,
    reasoning_evidence,
    recommended_sampling,
)

QWEN3_GENERATION_CONFIG = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                           "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                           "transformers_version": "4.51.0"}


def _folder(tmp_path, model_type: str, generation: dict | None = None, template: str | None = None):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder


def test_sampling_comes_from_generation_config_unless_set(tmp_path, monkeypatch):
    folder = _folder(tmp_path, "qwen3", QWEN3_GENERATION_CONFIG)
    assert recommended_sampling(folder) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}

    s = load_settings(None, {"generation": {"max_tokens": 32768}})
    lines = apply_generation_defaults(s, folder)
    assert sampling_params(s) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 32768, "seed": 0}
    assert f"generation.temperature=0.6 (from {folder}/generation_config.json)" in lines
    assert any(line.startswith("generation.top_k=20 ") for line in lines)

    # set in the environment (or a file, or a flag): the config wins, the rest still comes from the target
    monkeypatch.setenv("DRAFTSMITH_GENERATION__TEMPERATURE", "0")
    s = load_settings(None, {})
    lines = apply_generation_defaults(s, folder)
    assert (s.generation.temperature, s.generation.top_p, s.generation.top_k) == (0.0, 0.95, 20)
    assert not any("temperature" in line for line in lines)


def test_a_target_without_recommendation_keeps_greedy(tmp_path, embedded_target):
    s = load_settings(None, {})
    apply_generation_defaults(s, embedded_target)  # the real SmolLM2 file: token ids only
    assert sampling_params(s) == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 1024, "seed": 0}
    apply_generation_defaults(s, None)  # no checkpoint on this host: the config's own values
    assert s.generation.temperature == 0.0


def test_request_timeout_is_derived_from_the_lengths_unless_set(monkeypatch):
    assert derived_request_timeout_s(1024, 10.0) == 3600.0  # short answers: the floor
    assert derived_request_timeout_s(32768, 10.0) == pytest.approx(6553.6)
    s = load_settings(None, {"generation": {"max_tokens": 32768, "decode_tok_s": 5.0}})
    lines = apply_generation_defaults(s, None)
    assert s.generation.request_timeout_s == pytest.approx(13107.2)
    assert lines and lines[0].startswith("generation.request_timeout_s=13107 (derived: max_tokens 32768")
    monkeypatch.setenv("DRAFTSMITH_GENERATION__REQUEST_TIMEOUT_S", "900")
    s = load_settings(None, {"generation": {"max_tokens": 32768}})
    assert apply_generation_defaults(s, None) == [] and s.generation.request_timeout_s == 900.0


def test_reasoning_target_is_known_by_its_parser_or_its_template(tmp_path, embedded_target):
    assert "reasoning parser qwen3" in reasoning_evidence(_folder(tmp_path, "qwen3"))
    think = _folder(tmp_path, "llama", template="{{ '<think>\\n' }}{{ messages[-1].content }}")
    assert reasoning_evidence(think) == "its chat template writes <think>"
    assert reasoning_evidence(_folder(tmp_path, "mistral", template="{{ messages[-1].content }}")) is None
    assert reasoning_evidence(embedded_target) is None  # SmolLM2-135M-Instruct: no thinking


def test_cut_answers_of_a_reasoning_target_are_dropped_unless_set(tmp_path, embedded_target, monkeypatch):
    qwen = _folder(tmp_path, "qwen3")
    s = load_settings(None, {})
    lines = apply_data_defaults(s, qwen)
    assert s.data.truncated_answers == "drop"
    assert lines == ["data.truncated_answers=drop (a reasoning target: its profile (Qwen3) names the reasoning "
                     "parser qwen3; cut answers are dropped and counted in stats.json dropped_by_reason)"]
    s = load_settings(None, {})
    assert apply_data_defaults(s, embedded_target) == [] and s.data.truncated_answers == "keep"
    monkeypatch.setenv("DRAFTSMITH_DATA__TRUNCATED_ANSWERS", "keep")
    s = load_settings(None, {})
    assert apply_data_defaults(s, qwen) == [] and s.data.truncated_answers == "keep"


def test_build_data_drops_and_counts_the_cut_answers_of_a_reasoning_target(tmp_path, monkeypatch):
    """The real CLI on the tiny DeepSeek-V3 target (its template writes <think>; random weights, only its tokenizer
    is used): of 4 records, the one cut by max_tokens inside its reasoning is dropped and counted, with nothing set."""
    import os
    from pathlib import Path

    from draftsmith.cli import app
    from draftsmith.generation.store import write_shard
    from draftsmith.target.tiny_mla import TINY_MLA_NAME, gsm8k_examples, make_tiny_mla
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    prompts = Path(__file__).resolve().parents[2] / "data" / "prompts"
    target = make_tiny_mla(tmp_path / "cache", prompts, steps=0)
    tok = AutoTokenizer.from_pretrained(target)
    records = []
    for i, (q, r, a) in enumerate(gsm8k_examples(prompts, 4, reasoning_steps=None)):
        cut = i == 3
        ids = tok(r + "</think>" + a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        if cut:  # the answer ended by max_tokens inside the reasoning
            ids = tok(r, add_special_tokens=False)["input_ids"][:8]
        assistant = {"role": "assistant", "content": "" if cut else a,
                     "reasoning": tok.decode(ids) if cut else r}
        records.append({
            "schema": "draftsmith.record/1", "id": f"p{i:03d}", "status": "ok", "error": None, "model": TINY_MLA_NAME,
            "messages": [{"role": "user", "content": q}, assistant],
            "turns": [{"finish_reason": "length" if cut else "stop", "usage": {"completion_tokens": len(ids)},
                       "token_ids": ids, "reasoning_field": "reasoning", "latency_s": 0.0}],
            "sampling": {"temperature": 0.0}, "job_id": "j0", "created_at": "2026-12-06T00:00:00Z",
        })
    runs = tmp_path / "runs"
    write_shard(runs / "r" / "records", "j0", records)
    for k in [k for k in os.environ if k.startswith("DRAFTSMITH_")]:
        monkeypatch.delenv(k)
    res = CliRunner().invoke(app, ["build-data", "--run", "r", "--check"], env={
        "DRAFTSMITH_RUNS_DIR": str(runs), "DRAFTSMITH_TARGET__PATH": str(target), "DRAFTSMITH_DATA__MAX_DROP_RATE": "0.5"})
    assert res.exit_code == 0, res.output
    assert "Default data.truncated_answers=drop (a reasoning target: its chat template writes <think>" in res.output
    assert "3 turns token-exact of 4 records" in res.output and "dropped 1 {'truncated_answer': 1}" in res.output

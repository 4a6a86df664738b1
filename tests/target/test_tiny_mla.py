"""The tiny DeepSeek-V3 (MLA + MoE) target builder: shapes, tokenizer and template, idempotence, atomic writes.

Built with ``steps=0`` (random weights) where only shapes matter; the trained target goes through every stage in
``tests/test_mla_e2e.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from draftsmith.target.tiny_mla import (
    BOS,
    EOS,
    TINY_MLA_NAME,
    gsm8k_examples,
    is_current,
    make_tiny_mla,
    training_batches,
)

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "deepseek"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, make_tiny_mla(cache, PROMPTS, steps=0)


def test_checkpoint_is_a_deepseek_v3_mla_moe(tiny):
    _, path = tiny
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    # the only latent width vLLM's CPU MLA decode kernel takes: kv_lora_rank + qk_rope_head_dim = 576
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576
    assert cfg["q_lora_rank"] == 128 and cfg["qk_nope_head_dim"] == cfg["v_head_dim"] == 32
    assert cfg["first_k_dense_replace"] == 1 and cfg["n_routed_experts"] == 4 and cfg["n_shared_experts"] == 1
    assert cfg["topk_method"] == "noaux_tc"  # else vLLM has no e_score_correction_bias to load into
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # dense first layer
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys or any(k.startswith("model.layers.1.mlp.experts.")
                                                                     for k in keys)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in keys
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in keys
    assert "model.layers.2.self_attn.kv_a_proj_with_mqa.weight" in keys
    assert not (path.parent / (TINY_MLA_NAME + ".tmp")).exists()


def test_tokenizer_has_single_thinking_tokens_and_thinks_by_default(tiny):
    from transformers import AutoTokenizer

    _, path = tiny
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.bos_token == BOS and tok.eos_token == EOS and len(tok) <= 2048
    for t in ("<think>", "</think>", "<｜User｜>", "<｜Assistant｜>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    # not special: a server decodes with skip_special_tokens, and the reasoning parser splits on the text </think>
    ids = tok("R</think>A", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "R</think>A"
    user = [{"role": "user", "content": "What is 2+3?"}]
    assert tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True).endswith("<｜Assistant｜><think>")
    off = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, thinking=False)
    assert off.endswith("<｜Assistant｜></think>")


def test_training_examples_supervise_reasoning_and_answer(tiny):
    from transformers import AutoTokenizer

    _, path = tiny
    tok = AutoTokenizer.from_pretrained(path)
    ex = gsm8k_examples(PROMPTS, 4)
    # the reasoning is the first step of the worked solution only, so a briefly trained target learns to close it
    assert ex[0] == ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                     "How many clips did Natalia sell altogether in April and May?",
                     "Natalia sold 48/2 = 24 clips in May.", "The answer is 72.")
    whole = gsm8k_examples(PROMPTS, 1, reasoning_steps=None)[0][1]
    assert whole == "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May."
    ids, masks = training_batches(tok, ex)
    assert len(ids) >= 1 and all(len(i) == len(m) for i, m in zip(ids, masks, strict=True))
    text = tok.decode([t for t, m in zip(ids[0], masks[0], strict=True) if m], skip_special_tokens=False)
    assert text.startswith(ex[0][1][:20]) and text.endswith("</think>The answer is 72.<｜end▁of▁sentence｜>")


def test_rebuilt_only_when_the_recipe_changes(tiny):
    cache, path = tiny
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert make_tiny_mla(cache, PROMPTS, steps=0) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert is_current(path, steps=0) and not is_current(path, steps=80)


def test_the_packaged_template_is_the_fixtures():
    """The tiny target reads DeepSeek-V3.1's template from package data, never from tests/; it must stay the
    fixture the template tests check."""
    from importlib.resources import files

    from draftsmith.target.tiny_mla import TEMPLATE

    packaged = files("draftsmith.target").joinpath(TEMPLATE).read_text(encoding="utf-8")
    assert packaged == (FIXTURE / "chat_template.jinja").read_text(encoding="utf-8")


def test_a_missing_prompt_folder_names_the_setting(tmp_path):
    from draftsmith.errors import ModelError

    with pytest.raises(ModelError, match="DRAFTSMITH_PROMPTS_DIR"):
        gsm8k_examples(tmp_path, 4)

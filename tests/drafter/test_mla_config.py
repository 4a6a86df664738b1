"""The drafter config derived from MLA targets (DeepSeek-V3, Kimi-K2.5), checked against public drafter configs.

The target configs below are the public ``config.json`` fields of deepseek-ai/DeepSeek-V3 and of Kimi-K2.5's
``text_config`` (the fields a drafter reads); the drafter fields they are compared with come from the public
EAGLE-3 drafters k-l-lambda/Kimi-K2.5-Eagle3 (``config.json``) and SpecForge's
``configs/deepseek-v3-671b-eagle3.json`` (sgl-project/SpecForge). docs/mla.md has the field-by-field table.
"""

from __future__ import annotations

import json

import pytest
from draftsmith.drafter.config import attention_head_dim, derive_config, is_mla
from draftsmith.drafter.families.eagle3.export import eagle3_config, speculators_config

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "rope_theta": 10000, "hidden_act": "silu", "n_routed_experts": 256,
    "first_k_dense_replace": 3, "topk_method": "noaux_tc",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": {
        "model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
        "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "hidden_act": "silu",
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
    },
}
# k-l-lambda/Kimi-K2.5-Eagle3 config.json (the fields an engine reads)
PUBLIC_KIMI_DRAFTER = {
    "hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 64, "num_key_value_heads": 64,
    "head_dim": 128, "max_position_embeddings": 262144, "vocab_size": 163840, "rope_theta": 50000.0,
    "rms_norm_eps": 1e-5, "num_hidden_layers": 1, "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}


def write_target(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_mla_head_dim_is_the_value_head_not_the_rope_part():
    text = dict(DEEPSEEK_V3, head_dim=64)  # transformers writes head_dim = qk_rope_head_dim for deepseek_v3
    assert is_mla(text)
    assert attention_head_dim(text) == 128
    assert attention_head_dim({"hidden_size": 576, "num_attention_heads": 9}) == 64  # Llama: hidden // heads
    assert not is_mla({"hidden_size": 576, "num_attention_heads": 9})


def test_kimi_k25_drafter_matches_the_public_drafter_field_by_field(tmp_path):
    cfg = derive_config(write_target(tmp_path, KIMI_K25), draft_vocab_size=32000)
    exported = eagle3_config(cfg)
    for key, want in PUBLIC_KIMI_DRAFTER.items():
        got = exported["eagle_config"][key] if key.startswith("eagle_aux") else exported[key]
        if key == "rope_scaling":
            got = {("type" if k == "rope_type" else k): v for k, v in got.items()}
        assert got == want, key
    assert exported["draft_vocab_size"] == 32000
    assert cfg.layer_ids == [1, 29, 57]  # SpecForge's naming of the same tensors


def test_deepseek_v3_drafter_fields(tmp_path):
    cfg = derive_config(write_target(tmp_path, DEEPSEEK_V3), draft_vocab_size=32000)
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads) == (7168, 128, 128, 128)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (18432, 129280, 163840)
    assert cfg.rope_parameters == {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                   "rope_type": "yarn", "rope_theta": 10000.0}
    spec = speculators_config(cfg, 3, "deepseek-ai/DeepSeek-V3")
    layer = spec["transformer_layer_config"]
    assert layer["head_dim"] == 128 and layer["rope_scaling"]["factor"] == 40
    assert spec["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert spec["speculators_config"]["verifier"]["architectures"] == ["DeepseekV3ForCausalLM"]


@pytest.mark.parametrize("drop", ["v_head_dim"])
def test_mla_falls_back_to_the_nope_dim(tmp_path, drop):
    text = {k: v for k, v in DEEPSEEK_V3.items() if k != drop}
    assert attention_head_dim(text) == 128

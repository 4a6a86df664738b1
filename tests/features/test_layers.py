"""The layer-id convention and its validation (no model needed)."""

from __future__ import annotations

import pytest
from draftsmith.errors import ConfigError
from draftsmith.features.layers import default_layer_ids, hf_hidden_index, parse_layer_ids, vllm_aux_ids


def test_default_layers_smollm2_and_kimi():
    assert default_layer_ids(30) == (1, 14, 26)  # SmolLM2-135M
    assert default_layer_ids(61) == (1, 29, 57)  # DeepSeek-V3 / Kimi-K2 (eagle3.md)
    assert parse_layer_ids(None, 30) == (1, 14, 26)
    assert parse_layer_ids("2, 10,20", 30) == (2, 10, 20)


def test_engine_names_of_the_same_tensor():
    assert [hf_hidden_index(i) for i in (1, 14, 26)] == [2, 15, 27]
    # vLLM 0.32 records aux id k after decoder layer k-1; vLLM's own default (2, L//2, L-3) is our default
    assert vllm_aux_ids((1, 14, 26)) == [2, 15, 27] == [2, 30 // 2, 30 - 3]


@pytest.mark.parametrize("spec, words", [
    ("1,14,29", "out of range"), ("-1,3,5", "out of range"), ("1,14", "exactly 3"),
    ("5,3,7", "strictly increasing"), ("a,b,c", "not integers"),
])
def test_bad_layer_ids(spec, words):
    with pytest.raises(ConfigError, match=words) as e:
        parse_layer_ids(spec, 30)
    assert "->" in str(e.value)  # the fix is in the message


def test_final_norm_found_by_name_in_plain_and_wrapped_checkpoints(tmp_path):
    """The vllm backend applies the target's final norm itself; Kimi-K2.5 wraps its text model as
    ``language_model.model.*`` beside a vision tower, which two hard-coded names missed."""
    import json

    import torch
    from draftsmith.target.checkpoint import final_norm_key, load_final_norm
    from safetensors.torch import save_file

    plain = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight", "lm_head.weight"]
    kimi = ["language_model.model.layers.0.input_layernorm.weight", "language_model.model.layers.60.mlp.norm.weight",
            "language_model.model.norm.weight", "language_model.lm_head.weight", "vision_tower.encoder.norm.weight",
            "mm_projector.pre_norm.weight"]
    assert final_norm_key(plain) == "model.norm.weight"
    assert final_norm_key(kimi) == "language_model.model.norm.weight"
    assert final_norm_key(["model.language_model.norm.weight", "model.visual.norm.weight"]) == \
        "model.language_model.norm.weight"
    assert final_norm_key(["model.layers.0.input_layernorm.weight"]) is None
    # a sharded checkpoint: found through its weight index, read from the shard that holds it
    save_file({"language_model.model.layers.0.input_layernorm.weight": torch.zeros(4)}, str(tmp_path / "a.safetensors"))
    save_file({"language_model.model.norm.weight": torch.arange(4.0),
               "vision_tower.encoder.norm.weight": torch.ones(4)}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "language_model.model.layers.0.input_layernorm.weight": "a.safetensors",
        "language_model.model.norm.weight": "b.safetensors", "vision_tower.encoder.norm.weight": "b.safetensors"}}))
    assert torch.equal(load_final_norm(tmp_path), torch.arange(4.0))

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

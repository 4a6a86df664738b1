"""Aux layer ids per engine and layout, from the engines' sources (``draftsmith.features.layers``).

vLLM 0.32 (``_maybe_add_hidden_state(..., idx + 1, ...)``): id ``k`` is the output of decoder layer ``k - 1`` in both
layouts. SGLang (``set_eagle3_layers_to_capture`` after PR 25454, read from its source; SGLang does not run here):
ids whose first is 1 are output-of-layer ids, others capture-before-layer ids.
"""

from __future__ import annotations

import json

import pytest
from draftsmith.errors import ConfigError


def vllm_reads(config_ids):
    """Outputs of which decoder layers vLLM captures for ``config_ids`` (mirrors the loop in vLLM's llama.py)."""
    return [k - 1 for k in config_ids]


def test_vllm_capture_rule_is_the_installed_vllm_s():
    """Read from the installed vLLM's source (not imported: importing vLLM takes most of a minute here)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    src = " ".join((pkg / "model_executor" / "models" / "llama.py").read_text().split())
    assert "self._maybe_add_hidden_state( aux_hidden_states, idx + 1, hidden_states, residual )" in src


@pytest.mark.parametrize("ours", [(1, 14, 26), (2, 10, 20), (3, 15, 27)])
def test_default_and_later_first_layers_read_the_same_in_both_engines(ours):
    from draftsmith.features.layers import eagle3_layout_ids, sglang_reads, vllm_aux_ids

    ids = eagle3_layout_ids(ours)
    assert ids == [i + 1 for i in ours]
    assert vllm_reads(ids) == list(ours) == sglang_reads(ids)
    assert vllm_reads(vllm_aux_ids(ours)) == list(ours)  # speculators layout


def test_first_layer_0_is_read_one_layer_too_deep_by_sglang_so_eagle3_refuses_it():
    from draftsmith.features.layers import eagle3_layout_ids, sglang_reads, vllm_aux_ids

    ids = vllm_aux_ids((0, 14, 26))
    assert ids == [1, 15, 27] and vllm_reads(ids) == [0, 14, 26]
    assert sglang_reads(ids) == [1, 15, 27]  # the bug: SGLang adds 1 when the first id is 1
    assert sglang_reads([0, 14, 26]) == [-1, 13, 25]  # our own ids would give SGLang the embedding
    with pytest.raises(ConfigError, match=r"start at layer 0.*outputs of layers \[1, 15, 27\]"):
        eagle3_layout_ids((0, 14, 26))


@pytest.mark.parametrize("first", [0, 1])
def test_export_writes_each_layout_for_its_engines(first, embedded_target, tmp_path):
    import torch
    from draftsmith.drafter.config import derive_config
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
    from draftsmith.features.layers import sglang_reads

    torch.manual_seed(0)
    cfg = derive_config(str(embedded_target), 64, [first, 14, 26], 1, False)
    model = Eagle3Drafter(cfg)
    sp = json.loads((write_export(model, tmp_path / "speculators", "speculators") / "config.json").read_text())
    assert vllm_reads(sp["eagle_aux_hidden_state_layer_ids"]) == [first, 14, 26]
    if first == 0:
        with pytest.raises(ConfigError, match="export --format speculators"):
            write_export(model, tmp_path / "eagle3", "eagle3")
        assert not (tmp_path / "eagle3").exists() and not list(tmp_path.glob(".tmp-*"))
        return
    e = json.loads((write_export(model, tmp_path / "eagle3", "eagle3") / "config.json").read_text())
    ids = e["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert vllm_reads(ids) == sglang_reads(ids) == [1, 14, 26]

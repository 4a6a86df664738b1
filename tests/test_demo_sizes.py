"""The demo's presets are checked against the one config schema: each size's config loads as Settings (a wrong key
or value would raise ConfigError at `make demo`), as it runs here and where bf16 is native."""

from __future__ import annotations

from dataclasses import replace

import pytest
from draftsmith.demo_sizes import SIZES
from draftsmith.errors import ConfigError


@pytest.mark.parametrize("name", sorted(SIZES))
def test_each_size_config_is_valid_settings(name):
    size = SIZES[name]
    s = size.settings(run=f"demo-{name}")
    assert s.run == f"demo-{name}" and s.train.epochs == size.config["train"]["epochs"]
    assert s.data.draft_vocab_size == size.config["data"]["draft_vocab_size"]
    if size.native_bf16:  # the merged preset a CPU with AMX runs
        over = replace(size, native_bf16=None, config={**size.config, **{
            k: {**size.config.get(k, {}), **v} for k, v in size.native_bf16["config"].items()}})
        assert over.settings().generation.max_tokens == size.native_bf16["config"]["generation"]["max_tokens"]


def test_a_wrong_key_in_a_preset_is_a_config_error():
    bad = replace(SIZES["small"], config={**SIZES["small"].config, "train": {"epocs": 2}})
    with pytest.raises(ConfigError, match="unknown config key 'train.epocs'"):
        bad.settings()

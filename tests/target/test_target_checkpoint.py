"""One resolution of the target checkpoint for every stage (draftsmith.target.checkpoint)."""

from __future__ import annotations

import json
import shutil

import pytest
from draftsmith.config import load_settings
from draftsmith.errors import ModelError
from draftsmith.target.checkpoint import read_target_config, target_checkpoint


def test_target_path_wins_and_must_be_a_checkpoint(tmp_path, embedded_target):
    s = load_settings(None, {"target": {"path": str(embedded_target)}})
    assert target_checkpoint(s) == embedded_target
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    s = load_settings(None, {"target": {"path": str(empty)}})
    with pytest.raises(ModelError, match="no config.json") as e:
        target_checkpoint(s)
    assert "config.json, tokenizer and weights" in e.value.hint


def test_embedded_default_must_be_prepared_unless_asked_to(tmp_path, embedded_target):
    s = load_settings(None, {"target": {"cache_dir": str(tmp_path)}})
    with pytest.raises(ModelError, match="not prepared") as e:
        target_checkpoint(s)
    assert "draftsmith target prepare" in e.value.hint
    prepared = tmp_path / "models" / embedded_target.name
    shutil.copytree(embedded_target, prepared)  # what `target prepare` leaves, marker included
    assert target_checkpoint(s) == prepared


def test_read_target_config_text_part_and_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "text_config": {"hidden_size": 8}}))
    assert read_target_config(tmp_path)["model_type"] == "x"
    assert read_target_config(tmp_path, text=True) == {"hidden_size": 8}
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read the target config"):
        read_target_config(tmp_path)
    with pytest.raises(ModelError, match="does not exist"):
        read_target_config(tmp_path / "nope")

"""A drafter that does not fit the target is refused before any engine starts."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.errors import ModelError
from draftsmith.evaluation.checks import check_drafter_fits
from safetensors.torch import load_file, save_file


def test_fitting_drafter_passes(random_drafter, embedded_target):
    info = check_drafter_fits(embedded_target, random_drafter)
    assert (info.hidden_size, info.target_hidden_size, info.vocab_size) == (576, 576, 49152)
    assert info.draft_vocab_size == 4096 and info.layer_ids == (1, 14, 26)


def test_layer_ids_outside_target(write_drafter, embedded_target, tmp_path):
    d = write_drafter(tmp_path / "d", layer_ids=(1, 14, 30))
    with pytest.raises(ModelError, match=r"layer ids \[1, 14, 30\] do not fit a target with 30 layers"):
        check_drafter_fits(embedded_target, d)


def _edit_weights(folder, **replace):
    w = load_file(str(folder / "model.safetensors"))
    w.update(replace)
    save_file(w, str(folder / "model.safetensors"))


def test_hidden_size_mismatch(random_drafter, embedded_target):
    _edit_weights(random_drafter, **{"fc.weight": torch.zeros(576, 3 * 512, dtype=torch.bfloat16)})
    with pytest.raises(ModelError, match="hidden size mismatch.*1536.*1728"):
        check_drafter_fits(embedded_target, random_drafter)


def test_vocab_mismatch(random_drafter, embedded_target):
    t2d = torch.zeros(32000, dtype=torch.bool)
    t2d[:4096] = True
    _edit_weights(random_drafter, t2d=t2d)
    with pytest.raises(ModelError, match="vocabulary mismatch.*32000.*49152"):
        check_drafter_fits(embedded_target, random_drafter)


def test_short_position_limit(random_drafter, embedded_target):
    cfg = json.loads((random_drafter / "config.json").read_text())
    cfg["max_position_embeddings"] = 2048
    (random_drafter / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="max_position_embeddings 2048 is below the target's 8192"):
        check_drafter_fits(embedded_target, random_drafter)


def test_not_an_eagle3_export(random_drafter, embedded_target):
    w = load_file(str(random_drafter / "model.safetensors"))
    del w["d2t"]
    save_file(w, str(random_drafter / "model.safetensors"))
    with pytest.raises(ModelError, match="no 'd2t' weight"):
        check_drafter_fits(embedded_target, random_drafter)

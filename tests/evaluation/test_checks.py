"""A drafter that does not fit the target is refused before any engine starts."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.errors import ModelError
from draftsmith.evaluation.checks import check_drafter_fits
from draftsmith.evaluation.evaluate import draft_vocab_ids
from safetensors.torch import load_file, save_file


def test_fitting_drafter_passes(random_drafter, embedded_target):
    info = check_drafter_fits(embedded_target, random_drafter)
    assert (info.hidden_size, info.target_hidden_size, info.vocab_size) == (576, 576, 49152)
    assert info.draft_vocab_size == 4096 and info.layer_ids == (1, 14, 26)


def test_the_drafter_code_version_is_read_from_its_config(random_drafter, embedded_target):
    """A peer's export (the recorded random drafter has no ``code_version``) reads as None; a recorded one as is."""
    assert check_drafter_fits(embedded_target, random_drafter).code_version is None
    cfg = random_drafter / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "code_version": "draftsmith 0.1.0 (git abc1234)"}))
    assert check_drafter_fits(embedded_target, random_drafter).code_version == "draftsmith 0.1.0 (git abc1234)"


def test_eval_warns_before_any_engine_when_the_export_records_no_code_version(random_drafter, embedded_target,
                                                                           tmp_path, caplog):
    """The warning comes with the drafter checks; an unknown set then stops the run before an engine starts."""
    from draftsmith.config import load_settings
    from draftsmith.errors import DataError
    from draftsmith.evaluation.evaluate import run_evaluation

    s = load_settings(None, {"runs_dir": str(tmp_path / "runs"), "run": "x", "target": {"path": str(embedded_target)},
                             "eval": {"drafter": str(random_drafter), "sets": ["nope"]}})
    with caplog.at_level("WARNING", logger="draftsmith.evaluation.evaluate"), pytest.raises(DataError, match="nope"):
        run_evaluation(s)
    assert [r.getMessage() for r in caplog.records if "records no code_version" in r.getMessage()] == [
        f"the drafter {random_drafter} records no code_version (a peer's export, or an older draftsmith's); the "
        "report cannot say which build made it"]


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
    del w["fc.weight"]
    save_file(w, str(random_drafter / "model.safetensors"))
    with pytest.raises(ModelError, match="eagle3 layout\\) has no 'fc.weight' weight"):
        check_drafter_fits(embedded_target, random_drafter)


@pytest.mark.parametrize("layout", ["eagle3", "speculators"])
def test_both_layouts_of_our_export_fit(export_drafter, embedded_target, tmp_path, layout):
    """What `draftsmith export --format both` writes is evaluated in either layout (the speculators one has its
    decoder fields under transformer_layer_config and weights layers.0.*)."""
    d = export_drafter(tmp_path / layout, layout)
    info = check_drafter_fits(embedded_target, d)
    assert info.layout == layout
    assert (info.hidden_size, info.target_hidden_size, info.vocab_size, info.draft_vocab_size) == (576, 576, 49152, 64)
    assert info.layer_ids == (2, 15, 27)  # vLLM's numbering of our layers 1, 14, 26
    assert draft_vocab_ids(d) == frozenset(range(0, 192, 3))


def test_peer_speculators_drafter_with_d2t_only(export_drafter, embedded_target, tmp_path):
    """A speculators-trained drafter as vLLM loads it: no t2d (vLLM never reads it), no norm flags in its config
    (vLLM's speculators reader then takes norm_before_residual=true), its own copy of the embedding."""
    from draftsmith.drafter.load import load_export_model

    d = export_drafter(tmp_path / "peer", "speculators")
    w = load_file(str(d / "model.safetensors"))
    t2d = w.pop("t2d")
    w["embed_tokens.weight"] = torch.zeros(49152, 576, dtype=torch.bfloat16)
    save_file(w, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    for key in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output", "target_hidden_size"):
        del cfg[key]
    (d / "config.json").write_text(json.dumps(cfg))
    info = check_drafter_fits(embedded_target, d)
    assert (info.layout, info.draft_vocab_size, info.layer_ids) == ("speculators", 64, (2, 15, 27))
    assert draft_vocab_ids(d) == frozenset(range(0, 192, 3))  # from d2t: i + d2t[i]
    m = load_export_model(d, embedded_target)
    assert torch.equal(m.t2d, t2d) and int(m.d2t[5]) == 10
    assert m.cfg.norm_before_residual is True and m.cfg.norm_output is False


def test_aux_layer_ids_default_to_vllms(export_drafter, embedded_target, tmp_path):
    d = export_drafter(tmp_path / "noids", "speculators")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (d / "config.json").write_text(json.dumps(cfg))
    assert check_drafter_fits(embedded_target, d).layer_ids == (2, 15, 27)  # vLLM: (2, L//2, L-3), L = 30


def test_neither_layout_is_one_line(random_drafter, embedded_target):
    cfg = json.loads((random_drafter / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    del cfg["eagle_config"]
    (random_drafter / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError) as e:
        check_drafter_fits(embedded_target, random_drafter)
    msg = str(e.value)
    assert msg.startswith(f"{random_drafter} is not an EAGLE-3 drafter in either layout")
    assert "'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'speculators_model_type': None" in msg
    assert "-> pass a folder written by `draftsmith export` (export/eagle3 or export/speculators)" in msg
    assert "\n" not in msg

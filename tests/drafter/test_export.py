"""Export layouts (fields copied from the target, weight names), strict loading, fine-tune init, offline estimate."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.drafter.checkpoint import list_checkpoints
from draftsmith.drafter.families.eagle3.export import export_checkpoint
from draftsmith.drafter.load import load_checkpoint_model, load_export_model, load_pretrained
from draftsmith.errors import ModelError
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.slow  # trains a drafter on real SmolLM2 features first

ENGINE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act")


@pytest.fixture(scope="module")
def exported(reference_run, embedded_target, tmp_path_factory, draft_vocab):
    import shutil

    from draftsmith.config import load_settings
    from draftsmith.drafter.trainer import Trainer

    runs = tmp_path_factory.mktemp("exp") / "runs"
    shutil.copytree(reference_run, runs / "exp")
    s = load_settings(None, {"runs_dir": str(runs), "run": "exp", "target": {"path": str(embedded_target)},
                             "train": {"draft_vocab_size": draft_vocab, "ttt_steps": 2, "max_steps": 3,
                                       "batch_size": 4, "batch_tokens": 640, "lr": 1e-3}})
    Trainer(s).run()
    ckpt = list_checkpoints(runs / "exp" / "checkpoints")[-1]
    export_checkpoint(ckpt, str(embedded_target), runs / "exp" / "export", "both")
    return ckpt, runs / "exp" / "export"


def test_configs_copy_every_engine_field(exported, embedded_target):
    _, out = exported
    t = json.loads((embedded_target / "config.json").read_text())
    e = json.loads((out / "eagle3" / "config.json").read_text())
    sp = json.loads((out / "speculators" / "config.json").read_text())
    layer = sp["transformer_layer_config"]
    for key in ENGINE_FIELDS:
        assert e[key] == t[key] == layer[key], key
    assert e["rope_theta"] == layer["rope_theta"] == t["rope_parameters"]["rope_theta"] == 100000.0
    assert e["architectures"] == ["LlamaForCausalLMEagle3"] and e["num_hidden_layers"] == 1
    # our features are outputs of layers 1, 14, 26 -> vLLM reads them as aux ids 2, 15, 27
    assert e["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 15, 27], "use_aux_hidden_state": True}
    assert sp["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert e["norm_before_residual"] is False and sp["norm_before_residual"] is False
    assert sp["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert e["draft_vocab_size"] == sp["draft_vocab_size"] == 2048


def test_both_layouts_record_the_code_version_that_eval_reads_back(exported, embedded_target):
    """The export is an artifact like the others: its config says which build wrote it, and the evaluator's
    drafter check reads that back from either layout."""
    from draftsmith.artifacts.provenance import code_version
    from draftsmith.evaluation.checks import check_drafter_fits

    _, out = exported
    for layout in ("eagle3", "speculators"):
        cfg = json.loads((out / layout / "config.json").read_text())
        assert cfg["code_version"] == code_version() and cfg["code_version"].startswith("draftsmith "), layout
        assert check_drafter_fits(embedded_target, out / layout).code_version == code_version(), layout


def test_vllm_reads_the_configs_as_trained(exported):
    """vLLM's own config readers (no server): the speculators reader must not fall back to
    norm_before_residual=true, and the architecture must resolve to vLLM's EAGLE-3 Llama drafter."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    _, out = exported
    sp = json.loads((out / "speculators" / "config.json").read_text())
    SpeculatorsConfig.validate_speculators_config(sp)
    pre = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(sp)))
    assert pre["norm_before_residual"] is False
    assert pre["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert pre["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert SpeculatorsConfig.build_vllm_speculative_config(sp) == {"method": "eagle3", "num_speculative_tokens": 3}
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(out / "eagle3"))
    assert cfg.head_dim == 64 and cfg.max_position_embeddings == 8192


def test_weight_names_and_round_trip(exported, embedded_target):
    ckpt, out = exported
    e = load_file(str(out / "eagle3" / "model.safetensors"))
    sp = load_file(str(out / "speculators" / "model.safetensors"))
    assert "midlayer.hidden_norm.weight" in e and not any(k.startswith("layers.") for k in e)
    assert "layers.0.hidden_norm.weight" in sp and not any(k.startswith("midlayer.") for k in sp)
    for d in (e, sp):
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(d)
        assert not any("embed_tokens" in k for k in d)
    trained = load_checkpoint_model(ckpt, embedded_target)
    torch.manual_seed(0)
    ids, aux = torch.randint(0, 49152, (1, 7)), torch.randn(1, 7, 3 * 576)
    with torch.no_grad():
        ref = trained.logits(trained.step(ids, trained.fuse(aux), 0, trained.new_caches())[0])
        for layout in ("eagle3", "speculators"):
            m = load_export_model(out / layout, embedded_target)
            got = m.logits(m.step(ids, m.fuse(aux), 0, m.new_caches())[0])
            torch.testing.assert_close(got, ref)


def test_strict_loading_rejects_a_lost_rename(exported, embedded_target, tmp_path):
    _, out = exported
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((out / "eagle3" / "config.json").read_text())
    w = load_file(str(out / "eagle3" / "model.safetensors"))
    w = {k.replace("midlayer.", "decoder."): v for k, v in w.items()}  # a converter that lost the rename
    save_file(w, str(bad / "model.safetensors"))
    with pytest.raises(ModelError, match="missing .*layers.0"):
        load_export_model(bad, embedded_target)


def test_pretrained_init_checks_the_vocabulary(exported, embedded_target):
    ckpt, out = exported
    trained = load_checkpoint_model(ckpt, embedded_target)
    other = load_checkpoint_model(ckpt, embedded_target)
    with torch.no_grad():  # another draft vocabulary: shift every draft token to the next target id
        other.d2t.add_(1)
    with pytest.raises(ModelError, match=r"knows \d+ of this run.s 2048 draft tokens .*another draft vocabulary"):
        load_pretrained(other, out / "eagle3", remap=False)
    load_pretrained(other, out / "eagle3")  # remapped by default
    torch.testing.assert_close(other.fc.weight, trained.fc.weight)


def test_fine_tune_from_a_drafter_with_another_vocabulary(exported, embedded_target, tmp_path, caplog):
    """The run builds its own draft vocabulary (3,072 tokens), the real drafter exported above has 2,048 of the
    same data: remapped by default with the overlap logged, refused below train.remap_min_overlap."""
    import shutil

    from draftsmith.artifacts.data import vocab_dir
    from draftsmith.config import load_settings
    from draftsmith.data.vocab import write_draft_vocab
    from draftsmith.drafter.load import read_export
    from draftsmith.drafter.trainer import Trainer

    ckpt, out = exported
    runs = tmp_path / "runs"
    shutil.copytree(ckpt.parents[1], runs / "ft", ignore=shutil.ignore_patterns("checkpoints", "export"))
    write_draft_vocab(vocab_dir(runs / "ft" / "data"), 3072)  # what build-data writes for data.draft_vocab_size
    base = {"runs_dir": str(runs), "run": "ft", "target": {"path": str(embedded_target)},
            "train": {"draft_vocab_size": 3072, "ttt_steps": 2, "max_steps": 1, "batch_size": 4,
                      "batch_tokens": 640, "init_from": str(out / "eagle3")}}
    refused = {**base, "train": {**base["train"], "remap_min_overlap": 0.9}}
    with pytest.raises(ModelError, match=r"knows 2048 of this run's 3072 draft tokens \(66.7%.*remap_min_overlap=0.9"):
        Trainer(load_settings(None, refused))
    with pytest.raises(ModelError, match="remap_vocab is false"):
        Trainer(load_settings(None, {**base, "train": {**base["train"], "remap_vocab": False}}))
    with caplog.at_level("WARNING", logger="draftsmith.drafter.load"):
        trainer = Trainer(load_settings(None, base))
    assert "knows 2048 of this run's 3072 draft tokens (66.7%; its own draft vocabulary has 2048)" in caplog.text
    assert "the other 1024 rows start from train.lm_head_init" in caplog.text
    _, _, src = read_export(out / "eagle3")
    src_ids = (torch.arange(2048) + src["d2t"].long()).tolist()
    dst_ids = (torch.arange(3072) + trainer.model.d2t.cpu()).tolist()
    head = trainer.model.lm_head.weight.detach().cpu()
    for i, t in enumerate(dst_ids):  # every token the drafter knew keeps its trained row
        if t in src_ids:
            torch.testing.assert_close(head[i], src["lm_head.weight"][src_ids.index(t)])
    torch.testing.assert_close(trainer.model.fc.weight.detach().cpu(), src["fc.weight"])
    trainer.run()  # and fine-tunes
    assert list_checkpoints(runs / "ft" / "checkpoints")


def test_offline_estimate_definitions(exported, embedded_target):
    from draftsmith.drafter.offline import estimate_acceptance

    _, out = exported
    r = estimate_acceptance(embedded_target, out / "speculators",
                            [[{"role": "user", "content": "What is 3 plus 4?"}]], k=3, max_new_tokens=12)
    assert r["drafts"] > 0 and r["draft_tokens"] == 3 * r["drafts"]
    assert r["mean_acceptance_length"] == pytest.approx(1 + r["accepted"] / r["drafts"])
    assert r["acceptance_rate"] == pytest.approx(r["accepted"] / r["draft_tokens"])
    assert sum(r["per_position"]) == pytest.approx(r["accepted"] / r["drafts"])
    assert all(a >= b for a, b in zip(r["per_position"], r["per_position"][1:], strict=False))


def pretrained_with(out, tmp_path, **fields):
    """A copy of the eagle3 export with ``fields`` of its config.json replaced (a public drafter's other settings)."""
    import shutil

    folder = tmp_path / "pretrained"
    shutil.copytree(out / "eagle3", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_pretrained_init_compares_rope_and_every_computing_field(exported, embedded_target, tmp_path):
    from draftsmith.drafter.load import fit_to_pretrained

    ckpt, out = exported
    model = load_checkpoint_model(ckpt, embedded_target)
    ours = model.cfg.rope_parameters
    assert ours["rope_theta"] != 1e6
    # the public Kimi-K2.5 drafter's rotary settings beside its target's: theta 1e6, no scaling
    other_rope = {"rope_type": "default", "rope_theta": 1000000.0}
    folder = pretrained_with(out, tmp_path, rope_theta=1000000, rope_scaling=None, rope_parameters=other_rope)
    with pytest.raises(ModelError, match=r"rope: .*1000000.* in the pretrained drafter.*init_rope=drafter"):
        load_pretrained(model, folder)
    with pytest.raises(ModelError, match="rope"):
        fit_to_pretrained(model.cfg, folder)
    kept = fit_to_pretrained(model.cfg, folder, "drafter")
    assert kept.rope_parameters == other_rope and kept.hidden_size == model.cfg.hidden_size
    assert fit_to_pretrained(model.cfg, folder, "target").rope_parameters == ours
    load_pretrained(model, folder, rope="target")  # the explicit choice loads
    # the same rotation written the old way (theta as an int, no rope_parameters) is no difference
    same = pretrained_with(out, tmp_path / "same", rope_theta=int(ours["rope_theta"]), rope_parameters=None)
    assert fit_to_pretrained(model.cfg, same) == model.cfg
    # a norm epsilon is never adapted: one clause per field, both values
    eps = pretrained_with(out, tmp_path / "eps", rms_norm_eps=1e-6, hidden_act="gelu")
    with pytest.raises(ModelError, match=r"hidden_act: gelu in the pretrained drafter, silu.*rms_norm_eps: 1e-06"):
        fit_to_pretrained(model.cfg, eps, "drafter")


def test_fine_tune_keeps_the_pretrained_rope_through_export(exported, embedded_target, tmp_path, draft_vocab):
    import shutil

    from draftsmith.config import load_settings
    from draftsmith.drafter.load import load_export_model
    from draftsmith.drafter.trainer import Trainer

    ckpt, out = exported
    other_rope = {"rope_type": "default", "rope_theta": 1000000.0}
    folder = pretrained_with(out, tmp_path, rope_theta=1000000, rope_scaling=None, rope_parameters=other_rope)
    runs = tmp_path / "runs"
    shutil.copytree(ckpt.parents[1], runs / "ft", ignore=shutil.ignore_patterns("checkpoints", "export"))
    base = {"runs_dir": str(runs), "run": "ft", "target": {"path": str(embedded_target)},
            "train": {"draft_vocab_size": draft_vocab, "ttt_steps": 2, "max_steps": 1, "batch_size": 4,
                      "batch_tokens": 640, "init_from": str(folder)}}
    with pytest.raises(ModelError, match="init_rope"):
        Trainer(load_settings(None, base))
    base["train"]["init_rope"] = "drafter"
    trainer = Trainer(load_settings(None, base))
    assert trainer.model.cfg.rope_parameters == other_rope
    trainer.run()
    new = list_checkpoints(runs / "ft" / "checkpoints")[-1]
    export_checkpoint(new, str(embedded_target), runs / "ft" / "export", "both")
    for layout in ("eagle3", "speculators"):
        cfg = json.loads((runs / "ft" / "export" / layout / "config.json").read_text())
        layer = cfg.get("transformer_layer_config", cfg)
        assert layer["rope_theta"] == 1000000.0, layout
        assert load_export_model(runs / "ft" / "export" / layout, embedded_target).cfg.rope_parameters == other_rope

"""EAGLE-3.1's two options, ``norm_before_fc`` and ``norm_output``: what they change in the drafter, and that both
export layouts carry them the way vLLM 0.32 reads them (its own config readers; weight names of its loader).
Served in vLLM: ``tests/drafter/test_e2e_vllm.py::test_vllm_serves_eagle31_norms_as_trained``."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families.eagle3.export import write_export
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.load import load_export_model
from draftsmith.errors import ModelError
from safetensors.torch import load_file

H = 576  # SmolLM2-135M hidden size


def _drafter(target, **flags) -> Eagle3Drafter:
    torch.manual_seed(0)
    m = Eagle3Drafter(derive_config(target, 64, **flags))
    torch.nn.init.normal_(m.embed_tokens.weight, std=0.5)
    m.d2t.copy_(torch.arange(64) * 2)  # draft i -> target 3 * i
    m.t2d[torch.arange(64) * 3] = True
    return m.eval()


def vllm_param_names(weight_names: set[str], norm_before_fc: bool) -> set[str]:
    """The parameters of vLLM 0.32's ``Eagle3LlamaForCausalLM`` that a checkpoint's weights load into, following
    its ``load_weights``: ``t2d`` skipped, ``d2t`` -> ``draft_id_to_target_id``, ``model.`` before everything but
    ``lm_head``, ``midlayer.`` -> ``layers.0.``, ``input_norm.`` dropped unless ``norm_before_fc``, q/k/v and
    gate/up stacked."""
    out = set()
    for name in weight_names:
        if name == "t2d":
            continue
        if name == "d2t":
            out.add("draft_id_to_target_id")
            continue
        name = name if name.startswith("lm_head") else "model." + name.replace("midlayer.", "layers.0.")
        if name.startswith("model.input_norm.") and not norm_before_fc:
            continue
        for a, b in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                     (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
            name = name.replace(a, b)
        out.add(name)
    return out


VLLM_PARAMS = {  # named as in llama_eagle3.py: LlamaModel (fc, input_norm, layers, norm) and the lm_head
    "model.fc.weight", "model.norm.weight", "lm_head.weight", "draft_id_to_target_id",
    *(f"model.layers.0.{k}.weight" for k in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                             "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                             "mlp.down_proj")),
}


@torch.no_grad()
def test_norm_before_fc_is_one_rmsnorm_over_the_concatenation(embedded_target):
    """``fc(RMSNorm_{3H}(cat(a, b, c)))``: scaling all three aux features together changes nothing, scaling one
    of them does (that is fc_norm's job); without the option any scale reaches fc."""
    aux = torch.randn(1, 5, 3 * H)
    one = aux.clone()
    one[..., :H] *= 7.0
    m = _drafter(embedded_target, norm_before_fc=True)
    assert tuple(m.input_norm.weight.shape) == (3 * H,)
    torch.nn.init.uniform_(m.input_norm.weight, 0.5, 1.5)
    x = aux * torch.rsqrt(aux.pow(2).mean(-1, keepdim=True) + m.cfg.rms_norm_eps) * m.input_norm.weight
    torch.testing.assert_close(m.fuse(aux), m.fc(x))
    torch.testing.assert_close(m.fuse(aux * 5.0), m.fuse(aux), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(m.fuse(one), m.fuse(aux), atol=1e-2)
    plain = _drafter(embedded_target)
    assert plain.input_norm is None and not torch.allclose(plain.fuse(aux * 5.0), plain.fuse(aux), atol=1e-2)


@torch.no_grad()
def test_norm_output_feeds_the_normed_state_to_the_next_step(embedded_target):
    ids, aux = torch.randint(0, 300, (1, 6)), torch.randn(1, 6, 3 * H)
    on, off = _drafter(embedded_target, norm_output=True), _drafter(embedded_target)
    c_on, c_off = on.new_caches(), off.new_caches()
    n_on, next_on = on.step(ids, on.fuse(aux), 0, c_on)
    n_off, next_off = off.step(ids, off.fuse(aux), 0, c_off)
    torch.testing.assert_close(n_on, n_off)  # same weights: step 0's logits do not depend on the option
    assert next_on is n_on  # vLLM: aux_output = the final norm's output
    # the normed state has unit RMS (final norm weight 1 here); the pre-norm sum keeps the residual's scale
    torch.testing.assert_close(next_on.pow(2).mean(-1).sqrt(), torch.ones(1, 6), atol=1e-3, rtol=0)
    assert float((next_off.pow(2).mean(-1).sqrt() - 1).abs().min()) > 0.2
    torch.testing.assert_close(off.norm(next_off), n_off)
    # step 1 sees another hidden state, so the chain's second token comes from another input
    a, _ = on.step(ids, next_on, 1, c_on)
    b, _ = off.step(ids, next_off, 1, c_off)
    assert not torch.allclose(a, b, atol=1e-3)


def test_norm_before_fc_and_fc_norm_are_refused_together(embedded_target):
    from draftsmith.config import load_settings
    from draftsmith.errors import ConfigError

    with pytest.raises(ConfigError, match="train.norm_before_fc and train.fc_norm are both set; choose one"):
        load_settings(None, {"train": {"norm_before_fc": True, "fc_norm": True}})
    with pytest.raises(ModelError, match="norm_before_fc and fc_norm are both set"):
        derive_config(embedded_target, 64, fc_norm=True, norm_before_fc=True)
    t = load_settings(None, {"train": {"norm_before_fc": True, "norm_output": True}}).train
    assert (t.norm_before_fc, t.norm_output, t.fc_norm) == (True, True, False)


@pytest.mark.parametrize("flags", [{"norm_before_fc": True, "norm_output": True}, {}], ids=["on", "off"])
def test_exports_carry_the_options_as_vllm_reads_them(embedded_target, tmp_path, flags):
    from transformers import AutoConfig
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    on = bool(flags)
    m = _drafter(embedded_target, **flags)
    if on:
        torch.nn.init.uniform_(m.input_norm.weight, 0.5, 1.5)
    e_dir = write_export(m, tmp_path / "eagle3", "eagle3")
    s_dir = write_export(m, tmp_path / "speculators", "speculators", verifier=str(embedded_target))
    e, sp = json.loads((e_dir / "config.json").read_text()), json.loads((s_dir / "config.json").read_text())
    # written in both layouts, false included (an engine default never decides how the drafter is served)
    assert (e["norm_before_fc"], e["norm_output"], sp["norm_before_fc"], sp["norm_output"]) == (on,) * 4
    # vLLM's speculators reader copies them into the drafter's config
    pre = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(sp)))
    assert (pre["norm_before_fc"], pre["norm_output"], pre["fc_norm"]) == (on, on, False)
    # the eagle3 layout: llama_eagle3.py reads eagle_config's norm_before_fc, then the config's attribute
    # the eagle3 layout: vLLM wraps the checkpoint's config in its EAGLEConfig; llama_eagle3.py then reads
    # eagle_config's norm_before_fc before the attribute, and the norm_output attribute
    hf = EAGLEConfig(AutoConfig.from_pretrained(str(e_dir)), method="eagle3", model_type="eagle")
    assert hf.architectures == ["LlamaForCausalLMEagle3"]
    assert bool((hf.eagle_config or {}).get("norm_before_fc", getattr(hf, "norm_before_fc", False))) is on
    assert getattr(hf, "norm_output", False) is on
    for d in (e_dir, s_dir):
        w = load_file(str(d / "model.safetensors"))
        assert ("input_norm.weight" in w) is on
        if on:
            assert tuple(w["input_norm.weight"].shape) == (3 * H,)  # vLLM: RMSNorm(target_hidden_size * 3)
        # every weight lands in one of vLLM's parameters and every parameter gets one
        want = VLLM_PARAMS | ({"model.input_norm.weight"} if on else set())
        assert vllm_param_names(set(w), on) == want
        back = load_export_model(d, embedded_target)  # strict: the flags and the weight come back together
        assert (back.cfg.norm_before_fc, back.cfg.norm_output) == (on, on)
        if on:
            torch.testing.assert_close(back.input_norm.weight, m.input_norm.weight)

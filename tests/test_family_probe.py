"""The random drafters ``bench/family_probe.py`` writes are ones vLLM's own config code accepts, without a server:
``vllm.config.SpeculativeConfig`` is built on each (it reads the drafter's ``config.json`` through vLLM's
``ModelConfig`` and ``EAGLEConfig``, infers the method, resolves the architecture and turns on parallel drafting)
and the figures it derives are asserted. The weights' names are checked against the module names vLLM's loader of
the family maps them onto (``packed_modules_mapping`` of the model class the registry resolves). Served end to end:
``bench/family_probe.py`` (docs/families.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
K = 3


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("bench_family_probe", REPO / "bench" / "family_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def target_config(embedded_target):
    from vllm.config import ModelConfig

    return ModelConfig(model=str(embedded_target), dtype="float32", max_model_len=1024, enforce_eager=True)


def vllm_spec(probe, family, target_config, drafter):
    from vllm.config import ParallelConfig, SpeculativeConfig

    return SpeculativeConfig(**probe.speculative_config(family, drafter, K), target_model_config=target_config,
                             target_parallel_config=ParallelConfig())


# family -> (vLLM method, parallel drafting, extra scheduler slots per request, resolved architecture)
EXPECTED = {
    "eagle3": ("eagle3", False, 0, "LlamaForCausalLMEagle3"),
    "peagle": ("eagle3", True, K - 1, "LlamaForCausalLMEagle3"),
    "dflash": ("dflash", True, K, "DFlashDraftModel"),
    "dspark": ("dspark", True, K - 1, "Qwen3DSparkModel"),
    "pard": ("draft_model", True, K, "LlamaForCausalLM"),
}


@pytest.mark.parametrize("family", list(EXPECTED))
def test_vllm_accepts_the_random_drafter_config(probe, target_config, embedded_target, tmp_path, family):
    from vllm.model_executor.models.registry import ModelRegistry

    drafter = probe.write_drafter(family, embedded_target, tmp_path / family)
    sc = vllm_spec(probe, family, target_config, drafter)
    method, parallel, slots, arch = EXPECTED[family]
    assert (sc.method, sc.parallel_drafting, sc.max_num_new_slots_for_drafting) == (method, parallel, slots)
    assert sc.draft_model_config.architectures == [arch]
    cls, _ = ModelRegistry.resolve_model_cls([arch], sc.draft_model_config)
    hf = sc.draft_model_config.hf_config
    w = load_file(str(drafter / "model.safetensors"))
    mask = probe.mask_token_id(embedded_target)
    if family == "peagle":
        assert hf.mask_token_id == mask
        assert tuple(w["mask_hidden"].shape) == (1, 3 * 576)  # [1, n_aux*H]: llama_eagle3.py's mask_hidden buffer
    if family == "dspark":
        assert hf.markov_rank == probe.MARKOV_RANK
        assert tuple(w["markov_head.markov_w2.weight"].shape) == (49152, probe.MARKOV_RANK)
    if family in ("dflash", "dspark"):
        assert hf.dflash_config == {"target_layer_ids": [2, 15, 27], "mask_token_id": mask}
        assert tuple(w["fc.weight"].shape) == (576, 3 * 576)  # [H, n*H]: _get_dflash_fc_input_size
        assert not any(n.startswith(("embed_tokens", "lm_head")) for n in w)  # shared with the target
        packed = {src for srcs in cls.packed_modules_mapping.values() for src in srcs}
        projections = {n.split(".")[-2] for n in w if n.endswith("_proj.weight")}
        assert projections - {"o_proj", "down_proj"} <= packed, (projections, cls.packed_modules_mapping)
    if family == "pard":
        assert hf.pard_token == mask and hf.num_hidden_layers == 1


def test_unknown_family_is_refused(probe, embedded_target, tmp_path):
    with pytest.raises(ValueError, match="pick one of"):
        probe.write_drafter("medusa", embedded_target, tmp_path / "x")

"""The vllm backend for real: vLLM's CPU build (eager, in this process) with draftsmith's connector, same features
as hf. One vLLM engine, stopped at the end of the module."""

from __future__ import annotations

import pytest
import torch
from draftsmith.features.plan import make_plan, read_data_shard
from draftsmith.features.vllm_backend import engine_configs, text_only

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_engine_configs_name_vllm_ids(tmp_path):
    spec, kv = engine_configs((1, 14, 26), 30, tmp_path)
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27, 30]
    assert kv["kv_connector_module_path"] == "draftsmith.features.connector"


def test_a_multimodal_target_is_extracted_from_its_language_model_alone(tmp_path):
    """Kimi-K2.5's wrapper (text_config + vision_config) starts vLLM with language_model_only: its video
    preprocessor keys are not needed for text samples (the tiny Kimi-K2.5-layout target lacks them)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {}, "vision_config": {}}))
    assert text_only(tmp_path) == {"language_model_only": True}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert text_only(tmp_path) == {}


def test_vllm_equals_hf(data_run, make_settings):
    from draftsmith.features.hf import HFExtractor
    from draftsmith.features.vllm_backend import VLLMExtractor

    s = make_settings(data_run, backend="vllm", compute_dtype="float32")  # the HF reference below is float32
    plan = make_plan(s, data_run)
    seqs = read_data_shard(plan.data_dir, plan.shards[0])
    vx = VLLMExtractor.from_plan(plan, s)
    try:
        assert vx.scratch.parent == data_run / "features" / ".scratch"  # the run's disk, never /tmp
        got = vx.extract(seqs)
        assert list(vx.scratch.iterdir()) == []  # each request's file is deleted once read
    finally:
        vx.close()
    assert not (data_run / "features" / ".scratch").exists()
    hx = HFExtractor.load(plan.target_dir, plan.layer_ids, batch_tokens=256)
    ref = hx.extract(seqs)
    w = hx.lm_head_weight()
    for g, r in zip(got, ref, strict=True):
        assert g.aux.shape == r.aux.shape and g.final.shape == r.final.shape
        # same tensors up to kernel rounding (hidden states reach |x| ~ 300 here); stored bf16 rounds coarser
        torch.testing.assert_close(g.aux, r.aux, rtol=1e-3, atol=3e-2)
        torch.testing.assert_close(g.final, r.final, rtol=1e-3, atol=1e-3)
        assert torch.equal((g.final @ w.T).argmax(-1), (r.final @ w.T).argmax(-1))


@pytest.mark.slow  # two vLLM engine starts in one process
def test_released_engine_starts_again_in_the_same_process(data_run, make_settings):
    """An idle resident worker frees the vllm backend (release_extractors) and the next job starts a new engine in
    the same process: the distributed state of the first is gone, the features are the same."""
    from draftsmith.features.jobs import _EXTRACTORS, get_extractor, release_extractors

    release_extractors()  # the targets earlier tests of this worker process left loaded (the cache is per process)
    s = make_settings(data_run, backend="vllm", compute_dtype="float32")
    plan = make_plan(s, data_run)
    seqs = read_data_shard(plan.data_dir, plan.shards[0])
    first = get_extractor(plan, s).extract(seqs)
    assert release_extractors(5.0) == 1 and not _EXTRACTORS
    try:
        again = get_extractor(plan, s).extract(seqs)
    finally:
        release_extractors()
    for a, b in zip(first, again, strict=True):
        torch.testing.assert_close(a.aux, b.aux)

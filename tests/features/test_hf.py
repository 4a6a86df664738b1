"""The hf backend on the real SmolLM2: captured tensors, layer convention, logits round trip, padding."""

from __future__ import annotations

import pytest
import torch
from draftsmith.features.hf import HFExtractor, plan_batches


@pytest.fixture(scope="module")
def extractor(embedded_target):
    return HFExtractor.load(embedded_target, (1, 14, 26), batch_tokens=256)


@pytest.fixture(scope="module")
def seqs(embedded_target):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_target))
    texts = [[{"role": "user", "content": "What is the capital of France?"},
              {"role": "assistant", "content": "The capital of France is Paris."}],
             [{"role": "user", "content": "Hi"}]]
    return [torch.tensor(tok.apply_chat_template(m, tokenize=True, return_dict=True)["input_ids"]) for m in texts]


def test_layer_convention_matches_transformers_hidden_states(extractor, seqs):
    """aux = outputs of decoder layers 1, 14, 26 = transformers hidden_states[2], [15], [27]."""
    f = extractor.extract(seqs[:1])[0]
    with torch.inference_mode():
        out = extractor.model(seqs[0][None], output_hidden_states=True)
    hs = out.hidden_states  # 31 = embeddings + 30 layers (last one after the final norm)
    assert len(hs) == 31
    h = 576
    assert f.aux.shape == (seqs[0].numel(), 3 * h) and f.final.shape == (seqs[0].numel(), h)
    for k, idx in enumerate((2, 15, 27)):
        torch.testing.assert_close(f.aux[:, k * h : (k + 1) * h], hs[idx][0], rtol=0, atol=1e-5)
    # not the neighbours: an off-by-one would be caught
    assert not torch.allclose(f.aux[:, :h], hs[1][0], atol=1e-2)
    torch.testing.assert_close(f.final, hs[-1][0], rtol=0, atol=1e-5)


def test_logits_recomputed_from_final_hidden(extractor, seqs):
    """final_hidden is after the final norm: final @ lm_head.T equals the model's logits."""
    f = extractor.extract(seqs[:1])[0]
    with torch.inference_mode():
        logits = extractor.model(seqs[0][None]).logits[0]  # [T, V]
        w = extractor.lm_head_weight()  # [V, H]
        torch.testing.assert_close(f.final @ w.T, logits, rtol=1e-4, atol=1e-4)
        # as stored (bf16): same greedy token everywhere, logits within bf16 rounding
        bf = f.final.to(torch.bfloat16).float() @ w.T
    assert torch.equal(bf.argmax(-1), logits.argmax(-1))
    assert (bf - logits).abs().max().item() < 0.5


def test_padding_does_not_change_features(extractor, seqs):
    """A sample batched with a longer one (right padding) gets its single-sample features."""
    alone = extractor.forward_batch(seqs[1:])[0]
    padded = extractor.forward_batch(seqs)[1]
    assert padded.aux.shape == alone.aux.shape
    torch.testing.assert_close(padded.aux, alone.aux, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded.final, alone.final, rtol=1e-4, atol=1e-4)


def test_plan_batches_respects_budget():
    lengths = [10, 50, 30, 30, 5, 200]
    plan = plan_batches(lengths, 100)
    assert sorted(i for b in plan for i in b) == list(range(6))
    assert plan[0] == [5]  # longer than the budget: alone
    for b in plan[1:]:
        assert len(b) * max(lengths[i] for i in b) <= 100
    assert plan == plan_batches(lengths, 100)  # deterministic

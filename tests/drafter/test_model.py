"""The draft model and the TTT loss: config copied from the target, serving equivalence, loss mask, target view."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.ttt import simulated_acceptance_length, target_view, ttt_loss


@pytest.fixture(scope="module")
def cfg(embedded_target):
    return derive_config(embedded_target, draft_vocab_size=64)


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    m = Eagle3Drafter(cfg)
    torch.nn.init.normal_(m.embed_tokens.weight, std=0.5)
    d2t = torch.arange(64) * 3 - torch.arange(64)  # draft i -> target 3*i
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[torch.arange(64) * 3] = True
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
    return m.eval()


def test_config_is_copied_from_target(cfg, embedded_target):
    t = json.loads((embedded_target / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "max_position_embeddings", "vocab_size"):
        assert getattr(cfg, key) == t[key], key
    assert cfg.rope_parameters == t["rope_parameters"]
    assert cfg.layer_ids == [1, 14, 26]
    assert cfg.target_num_layers == 30


def test_parameter_count_about_ten_million(embedded_target):
    m = Eagle3Drafter(derive_config(embedded_target, draft_vocab_size=8192))
    n = sum(p.numel() for p in m.trainable_parameters())
    # fc 1728*576 + qkv 1152*960 + o 576*576 + mlp 3*576*1536 + lm_head 8192*576 + 4 norms
    assert n == 1728 * 576 + 1152 * 960 + 576 * 576 + 3 * 576 * 1536 + 8192 * 576 + 4 * 576
    assert not m.embed_tokens.weight.requires_grad


@torch.no_grad()
def test_ttt_rows_equal_serving_chain(cfg):
    """Row t of TTT step j must equal what a serving engine computes drafting j+1 tokens after prefix 0..t:
    step 0 over the prefix with real features, then chained steps on the last row only (no future leaks)."""
    m = _model(cfg)
    T, t, k = 12, 6, 3
    ids = torch.randint(0, 300, (1, T))
    aux = torch.randn(1, T, 3 * cfg.hidden_size)
    # whole-sequence TTT with ground-truth tokens
    hidden, caches, full = m.fuse(aux), m.new_caches(), []
    for j in range(k):
        ids_j = torch.cat([ids[:, j + 1 :], torch.zeros(1, j + 1, dtype=torch.long)], 1)
        normed, hidden = m.step(ids_j, hidden, j, caches)
        full.append(normed[0, t])
    # serving: prefix 0..t only (n = t+1 rows), token x[t+j+1] fed at the last row for step j
    n = t + 1
    hidden, caches = m.fuse(aux[:, :n]), m.new_caches()
    for j in range(k):
        row_ids = torch.zeros(1, n, dtype=torch.long)
        row_ids[0, :] = ids[0, j + 1 : j + 1 + n] if j == 0 else 0
        row_ids[0, -1] = ids[0, t + j + 1]
        normed, hidden = m.step(row_ids, hidden, j, caches)
        torch.testing.assert_close(normed[0, -1], full[j], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_step0_is_causal(cfg):
    m = _model(cfg)
    ids = torch.randint(0, 300, (1, 10))
    aux = torch.randn(1, 10, 3 * cfg.hidden_size)
    a, _ = m.step(ids, m.fuse(aux), 0, m.new_caches())
    ids2, aux2 = ids.clone(), aux.clone()
    ids2[0, 6:], aux2[0, 6:] = 5, 0.0
    b, _ = m.step(ids2, m.fuse(aux2), 0, m.new_caches())
    torch.testing.assert_close(a[0, :6], b[0, :6])
    assert not torch.allclose(a[0, 6:], b[0, 6:])


def test_target_view_matches_full_vocab(cfg):
    torch.manual_seed(0)
    V, H = cfg.vocab_size, cfg.hidden_size
    head = torch.randn(V, H)
    m = _model(cfg)
    fin = torch.randn(2, 5, H)
    fin[0, 0] = head[3 * 7] * 10  # top-1 = target 21 = draft 7 (in vocab)
    fin[0, 1] = head[1] * 10  # top-1 = target 1, not a draft token
    view = target_view(fin, head, m.d2t, m.t2d, chunk_rows=3)
    full = fin @ head.T  # [2, 5, V] reference (small here)
    assert torch.equal(view.in_vocab, m.t2d[full.argmax(-1)])
    assert bool(view.in_vocab[0, 0]) and not bool(view.in_vocab[0, 1])
    assert int(view.top[0, 0]) == 7
    ref = torch.softmax(full[..., torch.arange(64) * 3], -1)
    torch.testing.assert_close(view.probs, ref)


def test_loss_mask_positions_token_by_token(cfg):
    """Step j at row t is supervised iff token t+j+2 is target-generated and inside the sample."""
    m = _model(cfg).train()
    B, T, k = 2, 8, 3
    ids = torch.randint(0, 300, (B, T))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    lengths = torch.tensor([8, 6])
    fin = torch.randn(B, T, cfg.hidden_size)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    head[torch.arange(64) * 3] *= 50  # every top-1 in the draft vocabulary
    view = target_view(fin, head, m.d2t, m.t2d)
    assert bool(view.in_vocab.all())
    _, st = ttt_loss(m, ids, mask, torch.randn(B, T, 3 * cfg.hidden_size), lengths, view, k)
    for j in range(k):
        want = sum(int(mask[b, t + j + 2]) for b in range(B) for t in range(T) if t + j + 2 < int(lengths[b]))
        assert st.supervised[j] == want == st.loss_rows[j]
    # by hand: step 0 = sample 0 rows 1..3 (tokens 3..5) + sample 1 rows 0..3 (tokens 2..5); step 1 = 3 + 3;
    # step 2 = 2 + 2 (sample 1 ends at 6, so its rows stop earlier)
    assert st.supervised == [7.0, 6.0, 4.0]


def test_loss_backward_reaches_every_trainable_weight(cfg):
    m = _model(cfg).train()
    ids = torch.randint(0, 300, (1, 9))
    fin = torch.randn(1, 9, cfg.hidden_size)
    view = target_view(fin, torch.randn(cfg.vocab_size, cfg.hidden_size), m.d2t, m.t2d)
    view.in_vocab[:] = True
    loss, st = ttt_loss(m, ids, torch.ones(1, 9, dtype=torch.bool), torch.randn(1, 9, 3 * cfg.hidden_size),
                        torch.tensor([9]), view, k=3)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert m.embed_tokens.weight.grad is None


def test_simulated_acceptance_length():
    assert simulated_acceptance_length([1.0, 1.0, 1.0]) == 4.0
    assert simulated_acceptance_length([0.0, 1.0]) == 1.0
    assert simulated_acceptance_length([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)

"""Drafter families (``train.family``): the registry refuses what it cannot train, and P-EAGLE's training inputs
and loss are what vLLM's parallel drafting computes at serve time.

The serve-time reference is :func:`draftsmith.drafter.families.peagle.serve_logits`: one causal pass over the
verified rows followed by K - 1 mask slots (mask token, ``fc(mask_hidden)``, consecutive positions), the layout
``copy_and_expand_eagle_inputs`` of vLLM 0.32 builds. Training scores every row as an anchor at once with the
training-time-test unroll; the two must give the same logits for the same anchor.
"""

from __future__ import annotations

import pytest
import torch
from draftsmith.config import load_settings
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families import (
    FAMILIES,
    family_of_export,
    family_of_state,
    get_family,
    require_family,
    usable_family,
)
from draftsmith.drafter.families.peagle import PEagleDrafter, mask_token_id, serve_logits
from draftsmith.drafter.ttt import target_view, ttt_loss
from draftsmith.errors import ConfigError

N_DRAFT = 64


def _settings(tmp_path, **over):
    return load_settings(None, {"runs_dir": str(tmp_path), "run": "r", **over})


def test_unknown_and_missing_families_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ConfigError, match="unknown drafter family 'medusa'.*eagle3, peagle, dflash"):
        get_family("medusa")
    assert get_family("eagle3").method == get_family("peagle").method == "eagle3"
    assert set(FAMILIES) == {"eagle3", "peagle", "dflash"}
    with pytest.raises(ConfigError, match="train.family.*'eagle3', 'peagle' or 'dflash'"):  # the config key
        _settings(tmp_path, train={"family": "medusa"})


def test_peagle_is_refused_before_training_where_it_cannot_be_used(tmp_path):
    with pytest.raises(ConfigError, match="K = train.ttt_steps.*1 is EAGLE-3"):
        usable_family(_settings(tmp_path, train={"family": "peagle", "ttt_steps": 1}))
    with pytest.raises(ConfigError, match="engine 'sglang' cannot serve P-EAGLE"):
        usable_family(_settings(tmp_path, train={"family": "peagle"}, eval={"engine": "sglang"}))
    with pytest.raises(ConfigError, match="eagle3 layout only"):
        usable_family(_settings(tmp_path, train={"family": "peagle"}, export={"format": "speculators"}))
    assert usable_family(_settings(tmp_path, train={"family": "peagle", "ttt_steps": 3})).name == "peagle"
    with pytest.raises(ConfigError, match="checkpoint step-1 is a 'eagle3' drafter, train.family is 'peagle'"):
        require_family(family_of_state({"config": {"train": {}}}), "peagle", "checkpoint step-1")


def test_exports_and_checkpoints_name_their_family():
    assert family_of_state({}) == "eagle3"
    assert family_of_state({"config": {"train": {"family": "peagle"}}}) == "peagle"
    assert family_of_export({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"
    assert family_of_export({"mask_token_id": 0}) == "peagle"  # a peer's P-EAGLE export
    assert family_of_export({"dflash_config": {"mask_token_id": 0}}) == "dflash"
    assert family_of_export({"draftsmith_family": "peagle", "mask_token_id": 0}) == "peagle"
    spec = get_family("peagle").speculative_config("/d", 4)
    assert spec == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 4, "parallel_drafting": True}
    assert "parallel_drafting" not in get_family("eagle3").speculative_config("/d", 3)


def _drafter(embedded_target, **flags) -> PEagleDrafter:
    torch.manual_seed(0)
    m = PEagleDrafter(derive_config(embedded_target, N_DRAFT, **flags), mask_token_id(embedded_target))
    with torch.no_grad():
        m.embed_tokens.weight.normal_(0, 0.5)
        m.d2t.copy_(torch.arange(N_DRAFT) * 2)
        m.t2d[torch.arange(N_DRAFT) * 3] = True
        m.mask_hidden.normal_(0, 1.0)
    return m.double().eval()


@pytest.mark.parametrize("flags", [{}, {"norm_before_fc": True, "num_layers": 2}])
def test_peagle_training_slots_equal_vllm_parallel_drafting(embedded_target, flags):
    """Step j of the unroll at anchor row t == mask slot j of vLLM's single pass whose verified rows end at t."""
    m = _drafter(embedded_target, **flags)
    assert mask_token_id(embedded_target) == 0  # SmolLM2's unk_token_id
    T, K = 12, 4
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, m.cfg.vocab_size, (1, T), generator=g)
    aux = torch.randn(1, T, 3 * m.cfg.target_hidden_size, generator=g, dtype=torch.float64)
    got = {}
    hidden, caches = m.fuse(aux), m.new_caches()
    with torch.no_grad():
        for j in range(K):
            normed, hidden = m.step(torch.cat([ids[:, j + 1 :], ids[:, : j + 1]], 1), hidden, j, caches)
            got[j] = m.logits(normed)[0]  # [T, N]: row t = slot j after anchor t
    for n in (3, 7):  # verified rows 0..n-1, anchor n - 1
        want = serve_logits(m, ids, aux, n, K)  # [K, N]
        for j in range(K):
            torch.testing.assert_close(got[j][n - 1], want[j], rtol=1e-9, atol=1e-9)


def test_peagle_loss_shapes_and_mask_hidden_gradient(embedded_target):
    """The P-EAGLE loss has one column per parallel slot and trains ``mask_hidden`` (steps >= 1 read it)."""
    m = _drafter(embedded_target).float().train()
    B, T, K = 2, 10, 3
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, m.cfg.vocab_size, (B, T), generator=g)
    aux = torch.randn(B, T, 3 * m.cfg.target_hidden_size, generator=g)
    final = torch.randn(B, T, m.cfg.target_hidden_size, generator=g)
    head = torch.randn(m.cfg.vocab_size, m.cfg.target_hidden_size, generator=g) * 0.05
    view = target_view(final, head, m.d2t, m.t2d, in_vocab=torch.ones(B, T, dtype=torch.bool))
    lengths, loss_mask = torch.tensor([T, T - 2]), torch.ones(B, T)
    loss, stats = ttt_loss(m, ids, loss_mask, aux, lengths, view, K, decay=0.8, all_rows=False)
    assert stats.as_tensor().shape == (4, K)  # loss_sum, loss_rows, correct, supervised per slot
    # slot j of anchor t scores x[t+j+2]: (length - j - 2) rows per sample
    assert stats.supervised == [float(sum(int(n) - j - 2 for n in lengths)) for j in range(K)]
    loss.backward()
    assert m.mask_hidden.grad is not None and m.mask_hidden.grad.abs().sum() > 0
    assert m.mask_hidden.shape == (1, 3 * m.cfg.target_hidden_size)
    m.mask_hidden.grad = None  # with K = 1 no slot reads the mask: P-EAGLE reduces to EAGLE-3's first step
    ttt_loss(m, ids, loss_mask, aux, lengths, view, 1)[0].backward()
    assert m.mask_hidden.grad is None

"""Drafter families (``train.family``): the registry refuses what it cannot train, and P-EAGLE's training inputs
and loss are what vLLM's parallel drafting computes at serve time.

The serve-time reference is :func:`draftsmith.drafter.families.peagle.model.serve_logits`: one causal pass over the
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
from draftsmith.drafter.families.peagle.model import PEagleDrafter, mask_token_id, serve_logits
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


def test_a_family_whose_folder_this_build_lacks_is_refused_with_the_reason(monkeypatch):
    """Each family is a folder (``families/<name>/family.py``): a build without the folder refuses the family by
    name and lists the ones it holds, while an import error inside a family's own code is not hidden."""
    from draftsmith.drafter import families

    monkeypatch.setitem(families.REGISTRY, "dflash", "draftsmith.drafter.families.nothere.family")
    assert families.available() == ["eagle3", "peagle"]
    with pytest.raises(ConfigError, match=r"'dflash' is not in this build.*eagle3, peagle\)"):
        get_family("dflash")
    assert families.REGISTRY["eagle3"] == "draftsmith.drafter.families.eagle3.family"
    assert not families._held_by("draftsmith.drafter.families.eagle3.family", "safetensors")


def test_peagle_is_refused_before_training_where_it_cannot_be_used(tmp_path):
    with pytest.raises(ConfigError, match="K = train.ttt_steps.*1 is EAGLE-3"):
        usable_family(_settings(tmp_path, train={"family": "peagle", "ttt_steps": 1}))
    with pytest.raises(ConfigError, match="engine 'sglang' cannot serve P-EAGLE"):
        usable_family(_settings(tmp_path, train={"family": "peagle"}, eval={"engine": "sglang"}))
    with pytest.raises(ConfigError, match="eagle3 layout only"):
        usable_family(_settings(tmp_path, train={"family": "peagle"}, export={"format": "speculators"}))
    assert usable_family(_settings(tmp_path, train={"family": "peagle", "ttt_steps": 3})).name == "peagle"
    with pytest.raises(
        ConfigError, match="checkpoint step-1 is a 'eagle3' drafter, train.family is 'peagle'"
    ):
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


@pytest.mark.e2e
@pytest.mark.slow
def test_peagle_trains_exports_and_serves_in_vllm_token_identical(
    reference_run, embedded_target, draft_vocab, tmp_path
):
    """P-EAGLE end to end on real SmolLM2 features: a few training steps, the family's export, vLLM's CPU build
    with ``parallel_drafting: true`` (float32): greedy output identical to the target alone, and K draft tokens
    proposed per verify step (vLLM's spec-decode counters)."""
    import json
    import shutil

    from draftsmith.drafter.checkpoint import latest_checkpoint, read_state
    from draftsmith.drafter.trainer import Trainer
    from safetensors import safe_open
    from test_e2e_vllm import HELD_OUT
    from vllm_greedy import greedy_token_ids

    K = 3
    runs = tmp_path / "runs"
    shutil.copytree(reference_run, runs / "pe")
    s = load_settings(
        None,
        {
            "runs_dir": str(runs),
            "run": "pe",
            "target": {"path": str(embedded_target)},
            "train": {
                "family": "peagle",
                "draft_vocab_size": draft_vocab,
                "ttt_steps": K,
                "max_steps": 12,
                "batch_size": 4,
                "batch_tokens": 640,
                "lr": 2e-3,
                "log_every": 4,
                "eval_every": 1000,
            },
        },
    )
    result = Trainer(s).run()
    assert len(result["train"]["acc"]) == K and result["heldout"]["acc"][0] > 0, result
    ckpt = latest_checkpoint(runs / "pe" / "checkpoints")
    family = get_family(family_of_state(read_state(ckpt)))
    assert family.name == "peagle"
    (out,) = family.export_checkpoint(ckpt, str(embedded_target), runs / "pe" / "export", "both", K)
    cfg = json.loads((out / "config.json").read_text())
    assert (
        cfg["mask_token_id"] == 0
        and cfg["draftsmith_family"] == "peagle"
        and family_of_export(cfg) == "peagle"
    )
    with safe_open(str(out / "model.safetensors"), "pt") as st:
        assert st.get_slice("mask_hidden").get_shape() == [1, 3 * 576]  # [1, 3 * H_t] of SmolLM2-135M

    prompts = [[{"role": "user", "content": q}] for q in HELD_OUT[:3]]

    alone, _ = greedy_token_ids(None, embedded_target, tmp_path / "vllm-target.log", prompts)
    drafted, c = greedy_token_ids(family.speculative_config(out, K), embedded_target, tmp_path / "vllm-peagle.log",
                                  prompts)
    drafts, accepted = c.drafts, c.accepted
    print(
        json.dumps(
            {
                "drafts": drafts,
                "accepted": accepted,
                "mean_acceptance_length": 1 + accepted / drafts,
                "train_acc": result["train"]["acc"],
                "heldout_acc": result["heldout"]["acc"],
            }
        )
    )
    assert drafted == alone
    assert c.draft_tokens == K * drafts > 0


def test_eval_reads_a_peagle_export_and_names_the_family(embedded_target, tmp_path):
    """``draftsmith eval``'s checks accept the P-EAGLE export (its extra ``mask_hidden`` included), read its family
    from ``config.json`` and the report says which family was served and how it drafts."""
    from draftsmith.drafter.families.eagle3.export import write_export
    from draftsmith.evaluation.checks import check_drafter_fits
    from draftsmith.evaluation.evaluate import run_evaluation
    from draftsmith.evaluation.report import build_report, render_markdown

    m = _drafter(embedded_target).float()
    out = write_export(
        m,
        tmp_path / "eagle3",
        "eagle3",
        extra_config={"mask_token_id": m.mask_token_id, "draftsmith_family": "peagle"},
    )
    info = check_drafter_fits(embedded_target, out)
    assert info.family == "peagle" and info.draft_vocab_size == N_DRAFT
    with pytest.raises(ConfigError, match="cannot serve P-EAGLE"):
        get_family(info.family).check_engine("both")
    s = _settings(tmp_path, target={"path": str(embedded_target)}, eval={"drafter": str(out)})
    with pytest.raises(ConfigError, match="offline estimate drafts a greedy chain.*peagle drafter"):
        run_evaluation(s, offline=True)  # refused before any engine starts
    usable_family(
        _settings(
            tmp_path, target={"path": str(embedded_target)}, train={"family": "peagle", "init_from": str(out)}
        )
    )  # a P-EAGLE drafter fine-tunes
    eagle3_export = write_export(m, tmp_path / "plain", "eagle3")
    with pytest.raises(ConfigError, match="is not a P-EAGLE drafter.*no mask_token_id"):
        usable_family(
            _settings(
                tmp_path,
                target={"path": str(embedded_target)},
                train={"family": "peagle", "init_from": str(eagle3_export)},
            )
        )
    report = build_report("r", "vllm", 3, 0.0, [], str(embedded_target), str(out), family=info.family)
    assert report["family"] == "peagle"
    assert "peagle drafter" in render_markdown(report) and "(parallel, one drafter pass)" in render_markdown(
        report
    )

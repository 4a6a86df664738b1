"""Recipe keys: each one changes what it says (fc_norm, feature_noise, loss_rows, norm_init)."""

from __future__ import annotations

import json

import pytest
import torch
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.families.eagle3.objective import TTTObjective, add_feature_noise
from draftsmith.drafter.ttt import (
    acceptance_step_weights,
    greedy_mix,
    hard_row_weights,
    simulated_acceptance_length,
    target_view,
    ttt_loss,
)


@pytest.fixture(scope="module")
def target_cfg(embedded_target):
    return derive_config(embedded_target, draft_vocab_size=64)


def _vocab(m: Eagle3Drafter, cfg) -> None:
    m.d2t.copy_(torch.arange(64) * 3 - torch.arange(64))  # draft i -> target 3*i
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[torch.arange(64) * 3] = True
    m.t2d.copy_(t2d)


def _drafter_and_head(cfg) -> tuple[Eagle3Drafter, torch.Tensor]:
    """A seeded drafter with the test vocabulary and a target head whose top-1 always lies in it."""
    torch.manual_seed(0)
    m = Eagle3Drafter(cfg)
    _vocab(m, cfg)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    head[torch.arange(64) * 3] *= 50  # every top-1 in the draft vocabulary
    return m, head


@torch.no_grad()
def test_fc_norm_evens_out_the_scale_of_each_aux_feature(embedded_target):
    """With fc_norm, scaling one aux layer's feature (SmolLM2's three differ ~7x) does not change fc's input;
    without it, it does."""
    H = 576
    aux = torch.randn(1, 5, 3 * H)
    scaled = aux.clone()
    scaled[..., :H] *= 7.0
    scaled[..., 2 * H :] *= 0.5
    for fc_norm in (True, False):
        torch.manual_seed(0)
        m = Eagle3Drafter(derive_config(embedded_target, 64, fc_norm=fc_norm))
        same = torch.allclose(m.fuse(aux), m.fuse(scaled), atol=1e-3, rtol=1e-3)
        assert same is fc_norm
    assert len(m.fc_norm or []) == 0
    m = Eagle3Drafter(derive_config(embedded_target, 64, fc_norm=True))
    names = {k for k in m.state_dict() if k.startswith("fc_norm.")}
    assert names == {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}  # the names vLLM loads


def test_feature_noise_is_relative_to_each_feature_and_off_in_eval(target_cfg):
    torch.manual_seed(0)
    H = target_cfg.target_hidden_size
    aux = torch.cat([torch.randn(2, 64, H) * s for s in (1.0, 7.0, 0.5)], dim=-1)
    noisy = add_feature_noise(aux, 3, 0.1)
    for i, s in enumerate((1.0, 7.0, 0.5)):
        d = (noisy - aux)[..., i * H : (i + 1) * H]
        assert d.std().item() == pytest.approx(0.1 * s, rel=0.05)

    m = Eagle3Drafter(target_cfg)
    _vocab(m, target_cfg)
    obj = TTTObjective(m, k=2, decay=0.8, feature_noise=0.5)
    T = 10
    batch = {"input_ids": torch.randint(0, 300, (1, T)), "loss_mask": torch.ones(1, T, dtype=torch.bool),
             "aux": torch.randn(1, T, 3 * H), "lengths": torch.tensor([T])}
    head = torch.randn(target_cfg.vocab_size, H)
    head[torch.arange(64) * 3] *= 50  # every top-1 in the draft vocabulary: every row is in the loss
    view = target_view(torch.randn(1, T, H), head, m.d2t, m.t2d)
    obj.eval()
    with torch.no_grad():
        a, _ = obj(batch, view)
        b, _ = obj(batch, view)
    assert a.item() == b.item()  # eval: deterministic, no noise
    obj.train()
    with torch.no_grad():
        c, _ = obj(batch, view)
    assert c.item() != a.item()  # training: the features are perturbed


def test_all_rows_puts_prompt_rows_in_the_loss_but_not_in_accuracy(target_cfg):
    torch.manual_seed(0)
    m = Eagle3Drafter(target_cfg)
    _vocab(m, target_cfg)
    B, T, k = 1, 10, 2
    ids = torch.randint(0, 300, (B, T))
    mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    head = torch.randn(target_cfg.vocab_size, target_cfg.hidden_size)
    head[torch.arange(64) * 3] *= 50  # every top-1 in the draft vocabulary
    view = target_view(torch.randn(B, T, target_cfg.hidden_size), head, m.d2t, m.t2d)
    aux = torch.randn(B, T, 3 * target_cfg.hidden_size)
    _, gen = ttt_loss(m, ids, mask, aux, torch.tensor([T]), view, k)
    _, every = ttt_loss(m, ids, mask, aux, torch.tensor([T]), view, k, all_rows=True)
    # step j: rows t with t + j + 2 < 10 -> 8 and 7 rows; generated ones: tokens 5..9 -> 5 and 5 rows
    assert gen.loss_rows == [5.0, 5.0] and every.loss_rows == [8.0, 7.0]
    assert gen.supervised == every.supervised == [5.0, 5.0]
    assert gen.correct == every.correct


def test_acceptance_step_weights_are_the_gradient_of_acceptance_length():
    """Each step's weight is d(acceptance length)/d(its accuracy), scaled so step 0 weighs 1."""
    accs = torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64, requires_grad=True)
    length = 1 + torch.cumprod(accs, 0).sum()
    assert length.item() == pytest.approx(simulated_acceptance_length([0.5, 0.4, 0.3]))
    (grad,) = torch.autograd.grad(length, accs)
    w = acceptance_step_weights(accs.detach())
    torch.testing.assert_close(w, grad / grad[0])
    torch.testing.assert_close(w, torch.tensor([1.0, 0.65 / 1.52, 0.2 / 1.52], dtype=torch.float64))
    # a step after one that is never accepted is worth nothing
    assert acceptance_step_weights(torch.tensor([0.0, 0.5, 0.5])).tolist()[1:] == [0.0, 0.0]


def test_acceptance_step_weights_follow_the_training_accuracies(target_cfg):
    """The objective starts at decay ** j, then weights steps by the running training accuracies; evaluation
    neither changes nor is changed by them."""
    m, head = _drafter_and_head(target_cfg)
    B, T, k = 2, 12, 3
    batch = {"input_ids": torch.randint(0, 300, (B, T)), "loss_mask": torch.ones(B, T, dtype=torch.bool),
             "aux": torch.randn(B, T, 3 * target_cfg.hidden_size), "lengths": torch.tensor([T, T])}
    view = target_view(torch.randn(B, T, target_cfg.hidden_size), head, m.d2t, m.t2d)
    obj = TTTObjective(m, k, 0.8, step_weights="acceptance")
    assert obj._weights() == 0.8
    _, stats = obj(batch, view)
    torch.testing.assert_close(obj.accs, torch.tensor(stats.accs, dtype=torch.float32))
    first = obj.accs.clone()
    obj.eval()
    obj(batch, view)
    assert torch.equal(obj.accs, first)
    with pytest.raises(ValueError, match="not 'decay' or 'acceptance'"):
        TTTObjective(m, k, 0.8, step_weights="uniform")


def test_hard_row_weights_are_the_focal_factor_of_the_target_top1():
    """Row weight (1 - q) ** gamma, q the drafter's probability of the target's top-1; gamma 0 is no weighting."""
    probs = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]])  # [1, 2, 3]
    top = torch.tensor([[0, 0]])
    w = hard_row_weights(probs.log(), top, 2.0)
    torch.testing.assert_close(w, torch.tensor([[0.25, 0.81]]))
    assert not w.requires_grad
    assert hard_row_weights(probs.log(), top, 0.0) == 1.0


def test_hard_row_gamma_weights_the_loss_alike_chunked_and_dense_and_keeps_plain_stats(target_cfg):
    """Both loss paths weight rows the same way (loss and gradients); the stats' loss sums stay the unweighted
    soft cross-entropy; the objective weights training batches only."""
    m, head = _drafter_and_head(target_cfg)
    B, T, k = 2, 12, 3
    ids, mask = torch.randint(0, 300, (B, T)), torch.ones(B, T, dtype=torch.bool)
    aux, lengths = torch.randn(B, T, 3 * target_cfg.hidden_size), torch.tensor([T, T - 3])
    view = target_view(torch.randn(B, T, target_cfg.hidden_size), head, m.d2t, m.t2d)
    results = {}
    for mode in ("chunked", "dense"):
        for gamma in (0.0, 2.0):
            m.zero_grad()
            loss, stats = ttt_loss(m, ids, mask, aux, lengths, view, k, loss=mode, hard_row_gamma=gamma)
            loss.backward()
            results[mode, gamma] = (loss.detach(), stats.loss_sum, m.fc.weight.grad.clone())
    for gamma in (0.0, 2.0):
        (lc, sc, gc), (ld, sd, gd) = results["chunked", gamma], results["dense", gamma]
        torch.testing.assert_close(lc, ld)
        torch.testing.assert_close(gc, gd)
        assert sc == pytest.approx(sd)
    assert results["chunked", 2.0][1] == results["chunked", 0.0][1]  # plain soft-CE in the stats
    # an untrained drafter gives the top-1 about 1/64: every row weighs a little under 1
    assert 0.9 * results["chunked", 0.0][0] < results["chunked", 2.0][0] < results["chunked", 0.0][0]
    batch = {"input_ids": ids, "loss_mask": mask, "aux": aux, "lengths": lengths}
    plain, focal = TTTObjective(m, k, 0.8), TTTObjective(m, k, 0.8, hard_row_gamma=2.0)
    with torch.no_grad():
        assert focal(batch, view)[0] < plain(batch, view)[0]
        plain.eval()
        focal.eval()
        assert torch.equal(focal(batch, view)[0], plain(batch, view)[0])


def test_greedy_target_weight_moves_the_target_distribution_onto_its_top1(target_cfg):
    """greedy_mix: weight w keeps (1 - w) of the distribution and puts w on the top-1; w = 1 is the one-hot of the
    greedy token (the soft loss becomes the hard cross-entropy on it); w = 0 changes nothing."""
    torch.manual_seed(0)
    m = Eagle3Drafter(target_cfg)
    _vocab(m, target_cfg)
    head = torch.randn(target_cfg.vocab_size, target_cfg.hidden_size)
    final = torch.randn(2, 6, target_cfg.hidden_size)
    p0 = target_view(final, head, m.d2t, m.t2d).probs
    view = greedy_mix(target_view(final, head, m.d2t, m.t2d), 0.25)
    onehot = torch.nn.functional.one_hot(view.top, 64).float()  # [2, 6, 64]
    torch.testing.assert_close(view.probs, 0.75 * p0 + 0.25 * onehot)
    torch.testing.assert_close(view.probs.sum(-1), torch.ones(2, 6))
    assert torch.equal(greedy_mix(target_view(final, head, m.d2t, m.t2d), 1.0).probs, onehot)
    assert torch.equal(greedy_mix(target_view(final, head, m.d2t, m.t2d), 0.0).probs, p0)


def test_greedy_target_weight_trains_on_the_top1_but_held_out_stays_soft(run_factory):
    """The mix applies to training batches only: the held-out loss of the same weights is the soft cross-entropy
    whatever the weight, while one training step from the same init moves the weights differently."""
    from draftsmith.drafter.trainer import Trainer

    soft, hard = (Trainer(run_factory(f"g{w}", greedy_target_weight=w, max_steps=1, ttt_steps=2)) for w in (0.0, 1.0))
    assert soft.evaluate().losses == hard.evaluate().losses
    soft.run()
    hard.run()
    assert not torch.equal(soft.model.layers[0].mlp.down_proj.weight, hard.model.layers[0].mlp.down_proj.weight)


@pytest.mark.slow
def test_norm_init_target_copies_the_target_final_norm(run_factory):
    from draftsmith.drafter.trainer import Trainer
    from draftsmith.drafter.vocab import load_target_final_norm

    s = run_factory("normtarget", norm_init="target", max_steps=1)
    tr = Trainer(s)
    want = load_target_final_norm(s.target.path)
    assert not torch.allclose(want, torch.ones_like(want))  # SmolLM2's final norm is not the default init
    torch.testing.assert_close(tr.model.norm.weight.detach(), want)
    ones = Trainer(run_factory("normones", norm_init="ones", max_steps=1)).model.norm.weight.detach()
    torch.testing.assert_close(ones, torch.ones_like(ones))


@pytest.mark.slow
def test_fc_norm_is_exported_and_read_by_vllm(run_factory, embedded_target):
    """The exported configs carry fc_norm, vLLM's own config readers see it, and the weights are where vLLM
    loads them (``fc_norm.<i>.weight``)."""
    from draftsmith.drafter.checkpoint import list_checkpoints
    from draftsmith.drafter.families.eagle3.export import export_checkpoint
    from draftsmith.drafter.load import load_export_model
    from draftsmith.drafter.trainer import Trainer
    from safetensors.torch import load_file
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    s = run_factory("fcn", fc_norm=True, norm_before_residual=True, max_steps=2, ttt_steps=2)
    Trainer(s).run()
    ckpt = list_checkpoints(s.runs_dir / "fcn" / "checkpoints")[-1]
    out = s.runs_dir / "fcn" / "export"
    export_checkpoint(ckpt, str(embedded_target), out, "both")
    e = json.loads((out / "eagle3" / "config.json").read_text())
    assert e["fc_norm"] is True and e["norm_before_residual"] is True
    sp = SpeculatorsConfig.from_pretrained(str(out / "speculators"))
    assert sp.fc_norm is True and sp.norm_before_residual is True
    for layout in ("eagle3", "speculators"):
        w = load_file(str(out / layout / "model.safetensors"))
        assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(w)
        m = load_export_model(out / layout, embedded_target)  # strict loading round trip
        assert m.fc_norm is not None


@pytest.mark.slow
def test_eagle31_norms_are_trained_and_exported(run_factory, embedded_target):
    """The trainer builds the drafter with norm_before_fc and norm_output, trains input_norm, and both exports
    chain exactly as the checkpoint does (steps 0-2, where norm_output feeds the normed state back)."""
    from draftsmith.drafter.checkpoint import list_checkpoints, read_state
    from draftsmith.drafter.families.eagle3.export import export_checkpoint
    from draftsmith.drafter.load import load_checkpoint_model, load_export_model
    from draftsmith.drafter.trainer import Trainer

    s = run_factory("e31", norm_before_fc=True, norm_output=True, max_steps=2, ttt_steps=2)
    tr = Trainer(s)
    assert tr.model.input_norm is not None and tr.model.cfg.norm_output is True
    tr.run()
    ckpt = list_checkpoints(s.runs_dir / "e31" / "checkpoints")[-1]
    drafter = read_state(ckpt)["drafter"]
    assert (drafter["norm_before_fc"], drafter["norm_output"], drafter["fc_norm"]) == (True, True, False)
    trained = load_checkpoint_model(ckpt, embedded_target)
    assert not torch.allclose(trained.input_norm.weight, torch.ones(3 * 576))  # it learns
    out = s.runs_dir / "e31" / "export"
    export_checkpoint(ckpt, str(embedded_target), out, "both")
    torch.manual_seed(0)
    ids, aux = torch.randint(0, 49152, (1, 7)), torch.randn(1, 7, 3 * 576)

    @torch.no_grad()
    def chain(m):
        hidden, caches, outs = m.fuse(aux), m.new_caches(), []
        for j in range(3):
            normed, hidden = m.step(ids, hidden, j, caches)
            outs.append(m.logits(normed))
        return torch.stack(outs)

    ref = chain(trained)
    for layout in ("eagle3", "speculators"):
        torch.testing.assert_close(chain(load_export_model(out / layout, embedded_target)), ref)


def test_freeze_lm_head_needs_the_target_rows():
    from draftsmith.config import load_settings
    from draftsmith.errors import ConfigError

    with pytest.raises(ConfigError, match="freeze_lm_head needs train.lm_head_init=target"):
        load_settings(None, {"train": {"freeze_lm_head": True, "lm_head_init": "random"}})
    assert load_settings(None, {"train": {"freeze_lm_head": True}}).train.freeze_lm_head is True


@pytest.mark.slow
def test_freeze_lm_head_keeps_the_target_rows_and_trains_the_rest(run_factory):
    """With freeze_lm_head the head stays the target's draft rows through training (and in the stored weights,
    which export reads) while the decoder layer moves; without it the head moves too."""
    from draftsmith.drafter.checkpoint import list_checkpoints
    from draftsmith.drafter.trainer import Trainer
    from safetensors.torch import load_file

    for freeze in (True, False):
        name = f"frozen{int(freeze)}"
        tr = Trainer(run_factory(name, freeze_lm_head=freeze, max_steps=3, ttt_steps=2))
        head0 = tr.model.lm_head.weight.detach().clone()
        rows = tr.lm_head[torch.arange(tr.model.d2t.numel()) + tr.model.d2t]
        torch.testing.assert_close(head0, rows)  # init: the target's rows of the draft vocabulary
        mlp0 = tr.model.layers[0].mlp.down_proj.weight.detach().clone()
        assert any(p is tr.model.lm_head.weight for p in tr.model.trainable_parameters()) is not freeze
        tr.run()
        assert not torch.equal(tr.model.layers[0].mlp.down_proj.weight, mlp0)
        assert torch.equal(tr.model.lm_head.weight.detach(), head0) is freeze
        ckpt = list_checkpoints(tr.paths.checkpoints)[-1]
        stored = load_file(str(ckpt / "model.safetensors"))["lm_head.weight"]
        assert torch.equal(stored, head0) is freeze

"""The optimizer split (Muon on hidden matrices, AdamW on the rest) and the shared lr schedule's checkpoint state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from draftsmith.drafter import optimizer as optimizer_module
from draftsmith.drafter.newton_schulz import float32_newton_schulz, newton_schulz_float32
from draftsmith.drafter.optimizer import LRSchedule, Optimizers, split_for_muon
from torch import nn


class Toy(nn.Module):
    """The parameter kinds of a drafter: a frozen embedding, hidden matrices, a norm vector, the output head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 4)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(8, 4, bias=False)
        self.q_proj = nn.Linear(4, 4, bias=True)
        self.norm = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 6, bias=False)


def tc(optimizer: str, **kw) -> SimpleNamespace:
    return SimpleNamespace(optimizer=optimizer, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0, muon_lr=None,
                           muon_momentum=0.95, muon_weight_decay=0.1, **kw)


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    m = Toy()
    muon, adamw = split_for_muon(m)
    assert {id(p) for p in muon} == {id(m.fc.weight), id(m.q_proj.weight)}
    assert {id(p) for p in adamw} == {id(m.q_proj.bias), id(m.norm.weight), id(m.norm.bias), id(m.lm_head.weight)}
    opts = Optimizers(m, tc("muon"))
    assert [type(o).__name__ for o in opts] == ["Muon", "AdamW"]
    assert [type(o).__name__ for o in Optimizers(m, tc("adamw"))] == ["AdamW"]
    assert sum(len(g["params"]) for o in Optimizers(m, tc("adamw")) for g in o.param_groups) == 6  # not the embedding


def test_a_step_moves_every_trainable_parameter_and_not_the_embedding():
    torch.manual_seed(0)
    m = Toy()
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    opts = Optimizers(m, tc("muon"))
    x = torch.randn(3, 8)
    m.lm_head(m.norm(m.q_proj(m.fc(x)))).square().mean().backward()
    opts.step()
    opts.zero_grad()
    moved = {k for k, v in m.named_parameters() if not torch.equal(v, before[k])}
    assert moved == {"fc.weight", "q_proj.weight", "q_proj.bias", "norm.weight", "norm.bias", "lm_head.weight"}
    assert all(p.grad is None for p in m.parameters())


def test_the_schedule_is_shared_and_its_state_round_trips():
    m = Toy()
    opts = Optimizers(m, tc("muon"))
    sched = LRSchedule(opts, lambda step: 1.0 / (1 + step))
    for _ in range(3):
        opts.step()
        sched.step()
    assert sched.last_epoch == 3
    assert sched.get_last_lr() == pytest.approx([1e-2 / 4, 1e-2 / 4])  # Muon's lr = lr when muon_lr is None
    again = LRSchedule(Optimizers(m, tc("muon")), lambda step: 1.0 / (1 + step))
    again.load_state_dict(sched.state_dict())
    assert again.last_epoch == 3
    # a checkpoint of one optimizer (a plain LambdaLR state) restores both schedulers
    single = Optimizers(m, tc("adamw"))
    one = LRSchedule(single, lambda step: 1.0)
    single.step()
    one.step()
    again.load_state_dict(one.schedulers[0].state_dict())
    assert [s.last_epoch for s in again.schedulers] == [1, 1]
    with pytest.raises(ValueError, match="2 lr schedulers, this train.optimizer has 1"):
        LRSchedule(Optimizers(m, tc("adamw")), lambda step: 1.0).load_state_dict(sched.state_dict())


@pytest.mark.parametrize(("saved", "resumed"), [("adamw", "muon"), ("muon", "adamw")])
def test_a_checkpoint_of_the_other_optimizer_is_refused_with_its_fix(tmp_path, saved, resumed):
    from draftsmith.drafter.checkpoint import (
        full_optimizer_state,
        load_optimizer_state,
        model_state,
        save_checkpoint,
    )
    from draftsmith.errors import ModelError

    m = Toy()
    opts = Optimizers(m, tc(saved))
    sched = LRSchedule(opts, lambda step: 1.0)
    m.lm_head(m.norm(m.q_proj(m.fc(torch.randn(3, 8))))).square().mean().backward()
    opts.step()
    opts.zero_grad()  # as after a trainer step: a resume finds no gradients
    sched.step()
    ckpt = save_checkpoint(tmp_path, model_state(m), full_optimizer_state(m, opts), sched, {"step": 1}, keep=1)
    again = Optimizers(m, tc(resumed))
    with pytest.raises(ModelError, match=r"parameter groups of \[.*train.optimizer have") as e:
        load_optimizer_state(ckpt, m, again, LRSchedule(again, lambda step: 1.0))
    assert "train.resume=false" in e.value.hint
    # the same settings resume
    same = Optimizers(m, tc(saved))
    load_optimizer_state(ckpt, m, same, LRSchedule(same, lambda step: 1.0))
    assert [len(o.state) for o in same] == [len(o.state) for o in opts]


NS = ((3.4445, -4.7750, 2.0315), 5, 1e-7)  # torch.optim.Muon's defaults


@pytest.mark.parametrize("shape", [(48, 144), (144, 48), (64, 64)])
def test_the_float32_newton_schulz_is_torchs_iteration_without_bf16_rounding(shape):
    """The same iteration as torch's Muon (its result in bf16 lies within bf16 rounding of ours), in float32; a
    random rectangular matrix comes out near-orthogonal (every singular value in Muon's band around 1)."""
    import torch.optim._muon as muon

    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours = newton_schulz_float32(g, *NS)
    torch_own = muon._zeropower_via_newtonschulz(g, *NS)
    assert ours.dtype == torch.float32 and ours.shape == g.shape and torch_own.dtype == torch.bfloat16
    torch.testing.assert_close(ours, torch_own.float(), atol=2e-2, rtol=0)
    sv = torch.linalg.svdvals(ours)
    assert sv.max() < 1.25 and (shape[0] == shape[1] or 0.6 < sv.min())
    with pytest.raises(ValueError, match="2-D"):
        newton_schulz_float32(torch.ones(3), *NS)


def test_muon_steps_in_float32_only_where_bf16_is_emulated(monkeypatch):
    """On a CPU without bf16 kernels the Muon step runs the float32 iteration (and torch's own is back afterwards);
    with bf16 kernels it runs torch's own; the update is the same up to bf16 rounding either way."""
    import torch.optim._muon as muon

    own = muon._zeropower_via_newtonschulz
    calls: list[str] = []
    monkeypatch.setattr("draftsmith.drafter.newton_schulz.newton_schulz_float32",
                        lambda *a: calls.append("fp32") or newton_schulz_float32(*a))
    after = {}
    for kernels in (False, True):
        monkeypatch.setattr(optimizer_module, "cpu_has_bf16_kernels", lambda k=kernels: k)
        torch.manual_seed(0)
        model = Toy()
        opt = Optimizers(model, tc("muon"))
        assert opt.ns_float32 is (not kernels)
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.ones_like(p)
        opt.step()
        assert muon._zeropower_via_newtonschulz is own
        after[kernels] = model.fc.weight.detach().clone()
    assert calls == ["fp32", "fp32"]  # fc and q_proj, the Muon matrices, on the CPU without bf16 kernels only
    torch.testing.assert_close(after[False], after[True], atol=1e-3, rtol=0)
    with float32_newton_schulz(False) as swapped:
        assert swapped is False and muon._zeropower_via_newtonschulz is own

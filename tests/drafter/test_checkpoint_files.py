"""Checkpoint files without a model: rotation by write order, loading without unpickling code, no secrets."""

from __future__ import annotations

import json
import os

import pytest
import torch
from draftsmith.drafter.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_optimizer_state,
    load_plain,
    resolve_checkpoint,
    save_checkpoint,
)
from draftsmith.errors import ModelError


def _parts():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    return model, opt, sched


def _save(folder, step: int, keep: int = 3):
    from draftsmith.drafter.checkpoint import full_optimizer_state

    model, opt, sched = _parts()
    sched.step()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return save_checkpoint(folder, weights, full_optimizer_state(model, opt), sched,
                           {"step": step, "epoch": 0, "position": step}, keep)


def test_no_resume_rotation_keeps_the_new_step_1(tmp_path):
    """A run with step 2..4 trained again from scratch (`train --no-resume`): its step 1 is the newest."""
    ck = tmp_path / "checkpoints"
    for step in (2, 3, 4):
        _save(ck, step)
    _save(ck, 1)
    names = [p.name for p in list_checkpoints(ck)]
    assert names == ["step-00000003", "step-00000004", "step-00000001"]  # step 2, the oldest written, rotated out
    assert json.loads((ck / "latest.json").read_text()) == {"checkpoint": "step-00000001", "step": 1}
    assert latest_checkpoint(ck).name == "step-00000001"
    assert resolve_checkpoint(ck, None).name == "step-00000001"  # what `export` exports
    (ck / "latest.json").unlink()  # without the pointer the newest written still wins
    assert latest_checkpoint(ck).name == "step-00000001"


def test_checkpoint_loads_as_plain_data_and_resumes(tmp_path):
    ck = _save(tmp_path / "checkpoints", 7)
    model, opt, sched = _parts()
    load_optimizer_state(ck, model, opt, sched)
    assert sched.last_epoch == 1 and sched.get_last_lr() == [5e-4]
    assert set(load_plain(ck / "rng.pt")) >= {"python", "torch"}


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickled_callable_in_a_checkpoint_is_refused_not_run(tmp_path, monkeypatch):
    ck = _save(tmp_path / "checkpoints", 3)
    torch.save({"state": _Evil()}, ck / "scheduler.pt")
    model, opt, sched = _parts()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="cannot load .*scheduler.pt as plain tensors"):
        load_optimizer_state(ck, model, opt, sched)
    assert not (tmp_path / "pwned").exists()


def test_a_truncated_optimizer_file_is_one_error(tmp_path):
    ck = _save(tmp_path / "checkpoints", 3)
    data = (ck / "optimizer.pt").read_bytes()
    (ck / "optimizer.pt").write_bytes(data[: len(data) // 2])
    model, opt, sched = _parts()
    with pytest.raises(ModelError, match="optimizer.pt"):
        load_optimizer_state(ck, model, opt, sched)


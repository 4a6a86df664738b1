"""The learning curve's bookkeeping: the samples and tokens trained on, recomputed from the batch order, against a
replay of the trainer's own loop (ranks, accumulation, epochs); the curve's points at the steps ending each fraction."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from draftsmith.drafter.curve import add_point, curve_steps, seen
from draftsmith.drafter.data import make_batches


def replay(lengths, tc, world, steps):
    """What the trainer's loop consumes, step by step: each rank takes ``batches[rank::world]`` (evened across
    ranks), ``grad_accum`` micro-batches a step; ``[(epoch, position, samples, tokens)]`` after each step."""
    out, samples, tokens, epoch, position = [], 0, 0, 0, 0
    while len(out) < steps:
        b = make_batches(lengths, tc.batch_tokens, tc.batch_size, tc.seed, epoch)
        n = len(b) // world * world
        ranks = [b[r:n:world] for r in range(world)]
        usable = len(ranks[0]) // tc.grad_accum * tc.grad_accum
        while position < usable and len(out) < steps:
            for r in ranks:
                for mb in r[position : position + tc.grad_accum]:
                    samples += len(mb)
                    tokens += sum(lengths[i] for i in mb)
            position += tc.grad_accum
            out.append((epoch, position, samples, tokens))
        epoch, position = epoch + 1, 0
    return out


def test_seen_matches_the_loop_across_ranks_accumulation_and_epochs():
    lengths = {f"s{i:03d}": 20 + (i * 37) % 180 for i in range(53)}
    tc = SimpleNamespace(batch_tokens=512, batch_size=4, seed=7, grad_accum=2)
    for world in (1, 2):
        for epoch, position, samples, tokens in replay(lengths, tc, world, 30):
            assert seen(lengths, tc, world, epoch, position) == (samples, tokens), (world, epoch, position)
    # one epoch on one rank without accumulation is every sample once
    one = SimpleNamespace(batch_tokens=512, batch_size=4, seed=7, grad_accum=1)
    assert seen(lengths, one, 1, 1, 0) == (53, sum(lengths.values()))


def test_curve_steps_and_points():
    assert curve_steps(826, [0.125, 0.25, 0.5], 1000) == {104, 207, 413}
    assert curve_steps(826, [0.125, 0.25, 0.5], 200) == {
        104
    }  # the default demo: eval_every's points take over
    assert curve_steps(2, [0.125, 0.25, 0.5], 200) == {1}  # never step 0
    curve = []
    add_point(curve, {"step": 4, "x": 1})
    add_point(curve, {"step": 8, "x": 2})
    add_point(curve, {"step": 8, "x": 3})  # the closing evaluation at a step already evaluated replaces it
    assert curve == [{"step": 4, "x": 1}, {"step": 8, "x": 3}]


def curve_run(tmp_path, curve):
    """A run folder whose only artifact is a checkpoint's ``state.json`` holding ``curve``."""
    import json

    from draftsmith.artifacts.checkpoints import STATE_SCHEMA, write_latest

    ckpt = tmp_path / "run" / "checkpoints" / "step-00000826"
    ckpt.mkdir(parents=True)
    state = {"schema": STATE_SCHEMA, "step": 826}
    if curve is not None:
        state["learning_curve"] = curve
    (ckpt / "state.json").write_text(json.dumps(state))
    write_latest(ckpt.parent, ckpt.name, 826)
    from draftsmith.doctor.run import RunView

    return RunView(tmp_path / "run")


def point(step, held, train=None):
    return {
        "step": step,
        "epoch": 0,
        "samples_seen": 4 * step,
        "tokens_seen": 1000 * step,
        "heldout": {"acc": [], "accept_len": held},
        "train": None if train is None else {"accept_len": train},
    }


def test_data_size_on_the_default_demos_curve(tmp_path):
    """The default demo's training curve as docs/benchmarks.md records it (held-out 1.53, 1.69, 1.92, 2.05 at steps
    200, 400, 600, 826 of micro-batches of 4; training split 2.09 at the end): still rising; the slope over the
    last two doublings (steps 400..826) is numpy's least-squares line."""
    import numpy as np
    from draftsmith.doctor import data_size

    steps, held = [200, 400, 600, 826], [1.53, 1.69, 1.92, 2.05]
    run = curve_run(
        tmp_path,
        [point(s, h) for s, h in zip(steps[:-1], held[:-1], strict=True)] + [point(826, 2.05, 2.092)],
    )
    slope = np.polyfit(np.log2([1600, 2400, 3304]), [1.69, 1.92, 2.05], 1)[0]
    result = data_size.check(run)
    assert result.ran and len(result.findings) == 1
    f = result.findings[0]
    assert (
        f.cause
        == f"too little data: held-out acceptance length still rises {slope:.2f} per doubling of the samples trained on"
    )
    assert (
        f"fit over the last 3 points: {slope:+.3f}" in f.evidence
        and "training split 2.092 against held-out 2.050" in f.evidence
    )
    assert f"(x{2 ** (0.1 / slope):.1f} the data) for +0.1 accept_len" in f.fix
    assert f.cost == pytest.approx(slope / 2.05)


def test_data_size_flat_short_and_missing_curves(tmp_path):
    from draftsmith.doctor import data_size

    flat = data_size.check(
        curve_run(
            tmp_path / "a",
            [point(s, h, 1.7) for s, h in [(100, 1.60), (200, 1.61), (400, 1.60), (800, 1.61)]],
        )
    )
    assert flat.ran and flat.findings == [] and flat.note.startswith("flat: ")
    short = data_size.check(curve_run(tmp_path / "b", [point(1, 1.0), point(2, 1.01)]))
    assert not short.ran and "2 held-out point(s), needs 3" in short.note
    none = data_size.check(curve_run(tmp_path / "c", None))
    assert not none.ran and none.note.startswith("no learning curve recorded")

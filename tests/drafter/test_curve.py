"""The learning curve's bookkeeping: the samples and tokens trained on, recomputed from the batch order, against a
replay of the trainer's own loop (ranks, accumulation, epochs); the curve's points at the steps ending each fraction."""

from __future__ import annotations

from types import SimpleNamespace

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

"""The MFU's FLOP count, checked against torch's own count of the drafter's matmuls (FlopCounterMode) and against
the progress line that shows it."""

from __future__ import annotations

import pytest
import torch
from draftsmith.drafter.config import derive_config
from draftsmith.drafter.families.eagle3.model import Eagle3Drafter
from draftsmith.drafter.flops import forward_flops_per_token, mfu, peak_flops, train_flops_per_token


@pytest.mark.parametrize("k", [1, 3])
def test_forward_count_matches_torchs_count_of_the_unroll(embedded_target, k):
    """Run the TTT unroll's modules (fc, k decoder steps, k heads) under FlopCounterMode. torch counts attention
    over all T keys of each row (it does not know the mask is causal) where the formula counts the T/2 a causal row
    uses; at T = 8 attention is under 1 % of the total, so the two agree within 2 %."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = derive_config(embedded_target, draft_vocab_size=1024)
    m = Eagle3Drafter(cfg).eval()
    T = 8
    ids = torch.randint(0, 1000, (1, T))
    aux = torch.randn(1, T, 3 * cfg.target_hidden_size)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        hidden, caches = m.fuse(aux), m.new_caches()
        for j in range(k):
            normed, hidden = m.step(ids, hidden, j, caches)
            m.logits(normed)
    counted = fc.get_total_flops() / T
    assert forward_flops_per_token(cfg, T, k) == pytest.approx(counted, rel=0.02)
    assert train_flops_per_token(cfg, T, k) == 3 * forward_flops_per_token(cfg, T, k)


def test_mfu_needs_a_known_peak():
    assert peak_flops("cpu") is None and peak_flops("cpu", 2.0) == 2e12
    assert mfu(1000.0, 1e9, 1, None) is None
    assert mfu(1000.0, 1e9, 2, 1e12) == pytest.approx(0.5)  # 1e12 FLOP/s achieved over two 1e12 devices


def test_progress_line_shows_grad_norm_step_time_memory_and_mfu():
    from draftsmith.drafter.progress import StepTiming, progress_line
    from draftsmith.drafter.ttt import StepStats

    st = StepStats.of([2.0, 4.0], [1.0, 2.0], [1.0, 1.0], [2.0, 2.0])
    line = progress_line(10, 100, 0, st, 1e-4, 1234.0, 60.0, StepTiming(0.5, 1.25, 3.5, 0.412))
    assert "tok/s 1,234 grad_norm 0.500 step_s 1.25 peak_mem 3.50 GB mfu 41.2% elapsed 0:01:00" in line
    assert "mfu" not in progress_line(10, 100, 0, st, 1e-4, 1234.0, 60.0, StepTiming(0.5, 1.25, 3.5, None))

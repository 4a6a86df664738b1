"""bench/families.py: its help, and the lines it prints from given per-prompt counts and timings (no training, no
server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import families as fb  # noqa: E402


def _prompts(drafts, accepted, tokens, seconds, sets=("gsm8k", "alpaca")):
    return [fb.PromptTiming(s, f"{s}-{i}", d, a, t, x)
            for i, (s, d, a, t, x) in enumerate(zip(sets, drafts, accepted, tokens, seconds, strict=True))]


def test_help_names_the_families_and_the_k_override():
    p = subprocess.run([sys.executable, str(BENCH / "families.py"), "--help"], capture_output=True, text=True,
                       timeout=60, cwd=BENCH.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("usage:")
    for flag in ("--families", "--k FAMILY=K", "--seeds", "--split", "--reuse"):
        assert flag in p.stdout


def test_report_prints_acceptance_per_set_speedup_and_ratio_over_eagle3():
    # the target alone: 64 tokens in 4 s and 32 tokens in 2 s -> 16 tok/s
    alone = _prompts([0, 0], [0, 0], [64, 32], [4.0, 2.0])
    measured = {
        # 20 tok/s both seeds -> speedup 1.25; acceptance (1 + 30/40) on gsm8k, (1 + 10/20) on alpaca
        "eagle3": [_prompts([40, 20], [30, 10], [64, 32], [3.2, 1.6])] * 2,
        # 32 tok/s -> speedup 2.0; 2.0 / 1.25 = 1.6
        "dflash": [_prompts([10, 10], [20, 5], [64, 32], [2.0, 1.0]), _prompts([10, 10], [20, 5], [64, 32], [2.0, 1.0])],
    }
    lines = fb.report(measured, alone)
    assert "ACCEPT eagle3 gsm8k 1.750" in lines
    assert "ACCEPT eagle3 alpaca 1.500" in lines
    assert "ACCEPT eagle3 all 1.667" in lines
    assert "ACCEPT dflash gsm8k 3.000" in lines
    assert "ACCEPT dflash alpaca 1.500" in lines
    assert "SPEEDUP eagle3 1.250 (2 seed(s))" in lines
    assert "SPEEDUP dflash 2.000 (2 seed(s))" in lines
    assert "RATIO family_speedup_eagle3 1.000" in lines
    assert "RATIO family_speedup_dflash 1.600" in lines
    # every prompt runs at the same rate on each side, so every resample gives the same ratio
    assert "INTERVAL family_speedup_dflash 1.600 1.600" in lines
    # acceptance over eagle3's, every seed pooled: dflash (1 + 50/40) / eagle3 (1 + 80/120)
    assert f"RATIO family_acceptance_dflash {2.25 / (1 + 80 / 120):.3f}" in lines


def test_seeded_ratio_interval_spans_the_seeds():
    alone = _prompts([0, 0], [0, 0], [10, 10], [1.0, 1.0])
    base = [_prompts([1, 1], [0, 0], [10, 10], [1.0, 1.0])]  # speedup 1.0
    ours = [_prompts([1, 1], [1, 1], [10, 10], [0.5, 0.5]),  # 2.0
            _prompts([1, 1], [1, 1], [10, 10], [1.0, 1.0])]  # 1.0
    point, low, high = fb.seeded_speedup_ratio(ours, base, alone, resamples=500)
    assert point == pytest.approx(1.5)
    assert low == pytest.approx(1.0) and high == pytest.approx(2.0)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="different prompts"):
        fb.speedup(_prompts([1], [0], [1], [1.0], sets=("gsm8k",)), _prompts([1], [0], [1], [1.0], sets=("alpaca",)))
    with pytest.raises(ValueError, match="was the drafter loaded"):
        fb.acceptance_length(_prompts([0], [0], [1], [1.0], sets=("gsm8k",)))
    with pytest.raises(SystemExit, match="FAMILY=K"):
        fb.parse_k(["medusa=3"])
    assert fb.parse_k(["dflash=15"]) == {**fb.DEFAULT_K, "dflash": 15}
    assert fb.prompt_range(fb.SPLITS["report"]) == (40, 80)

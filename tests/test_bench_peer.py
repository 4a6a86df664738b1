"""bench/peer.py's figures: the mean acceptance length as vLLM computes it, and the paired bootstrap of the ratio.

The per-prompt counts are those vLLM's counters give (drafts, accepted tokens); the bench itself needs the peer's
virtualenv and two vLLM servers, so it runs as ``make peer-quick``, not here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("bench_peer", REPO / "bench" / "peer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_peer"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _counts(peer, rows):
    return [peer.PromptCounts("gsm8k", f"p{i}", d, a) for i, (d, a) in enumerate(rows)]


def test_acceptance_length_is_one_plus_accepted_per_draft(peer):
    assert peer.acceptance_length(_counts(peer, [(10, 5), (30, 25)])) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="no draft"):
        peer.acceptance_length(_counts(peer, [(0, 0)]))


def test_paired_ratio_and_its_interval(peer):
    peer_side = _counts(peer, [(40, 16 + i % 5) for i in range(40)])
    same = peer.paired_ratio(peer_side, peer_side)
    assert same == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    ours = _counts(peer, [(36, 20 + i % 7) for i in range(40)])  # fewer verify steps, more accepted each
    ratio, low, high = peer.paired_ratio(ours, peer_side)
    want = (1 + sum(20 + i % 7 for i in range(40)) / (36 * 40)) / (1 + sum(16 + i % 5 for i in range(40)) / 1600)
    assert ratio == pytest.approx(want) and 1.0 < low < ratio < high < 1.2
    assert peer.paired_ratio(ours, peer_side) == (ratio, low, high)  # seeded: the same interval every time
    with pytest.raises(ValueError, match="different prompts"):
        peer.paired_ratio(ours[:-1], peer_side[1:])


def test_a_kept_peer_side_is_read_back_as_measured(peer, tmp_path):
    side = peer.Side("speculators", tmp_path / "d", 92.0, _counts(peer, [(40, 17), (12, 3)]))
    peer.save_peer(side, tmp_path / "peer.json")
    back = peer.peer_from(tmp_path / "peer.json")
    assert back == side and peer.acceptance_length(back.prompts) == pytest.approx(1 + 20 / 52)

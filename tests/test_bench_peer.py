"""bench/peer.py's records: a kept peer side read back as measured (the figures are bench/protocol.py's, tested in
tests/test_bench_protocol.py).

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


def test_a_kept_peer_side_is_read_back_as_measured(peer, tmp_path):
    side = peer.Side("speculators", tmp_path / "d", 92.0, _counts(peer, [(40, 17), (12, 3)]))
    peer.save_peer(side, tmp_path / "peer.json")
    back = peer.peer_from(tmp_path / "peer.json")
    assert back == side and peer.acceptance_length(back.prompts) == pytest.approx(1 + 20 / 52)

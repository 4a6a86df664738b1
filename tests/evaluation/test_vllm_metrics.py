"""vLLM acceptance formulas against /metrics text recorded from real vLLM CPU servers (see the fixture README)."""

from __future__ import annotations

import pytest
from draftsmith.errors import EngineError
from draftsmith.evaluation.prom import parse_text, total
from draftsmith.evaluation.vllm_metrics import SpecCounters, acceptance_from_counters

MODEL = "SmolLM2-135M-Instruct"


def test_recorded_random_drafter_counters_and_formulas(fixtures_dir):
    before = SpecCounters.from_text((fixtures_dir / "vllm_metrics_spec_before.txt").read_text(), MODEL)
    after = SpecCounters.from_text((fixtures_dir / "vllm_metrics_spec_after.txt").read_text(), MODEL)
    assert before.has_spec and before.drafts == 0.0 and before.per_pos == (0.0, 0.0, 0.0)
    d = after - before
    assert (d.drafts, d.draft_tokens, d.accepted, d.generation_tokens) == (30.0, 90.0, 0.0, 33.0)
    assert d.draft_tokens == 3 * d.drafts  # chain drafting, K = 3
    a = acceptance_from_counters(d, k=3)
    # a random drafter: nothing accepted, one token (the bonus) per verify step
    assert a.acceptance_rate == 0.0
    assert a.mean_acceptance_length == 1.0
    assert a.per_position == [0.0, 0.0, 0.0]


def test_formulas_on_recorded_text_with_accepted_tokens(fixtures_dir):
    # The recorded 'after' text with the accepted counters edited (the random drafter accepted none):
    # 30 drafts, 90 draft tokens, 45 accepted, per position 20 / 15 / 10.
    text = (fixtures_dir / "vllm_metrics_spec_after.txt").read_text()
    pre = 'vllm:spec_decode_num_accepted_tokens'
    text = text.replace(f'{pre}_total{{engine="0",model_name="{MODEL}"}} 0.0',
                        f'{pre}_total{{engine="0",model_name="{MODEL}"}} 45.0')
    for pos, n in ((0, 20), (1, 15), (2, 10)):
        text = text.replace(f'{pre}_per_pos_total{{engine="0",model_name="{MODEL}",position="{pos}"}} 0.0',
                            f'{pre}_per_pos_total{{engine="0",model_name="{MODEL}",position="{pos}"}} {n}.0')
    before = SpecCounters.from_text((fixtures_dir / "vllm_metrics_spec_before.txt").read_text(), MODEL)
    a = acceptance_from_counters(SpecCounters.from_text(text, MODEL) - before, k=3)
    assert a.acceptance_rate == pytest.approx(45 / 90)
    assert a.mean_acceptance_length == pytest.approx(1 + 45 / 30)  # 2.5 tokens per verify step
    assert a.per_position == pytest.approx([20 / 30, 15 / 30, 10 / 30])
    # per-position rates sum to the accepted tokens per draft: mean length = 1 + sum(per_position)
    assert a.mean_acceptance_length == pytest.approx(1 + sum(a.per_position))


def test_server_without_drafter_is_refused(fixtures_dir):
    c = SpecCounters.from_text((fixtures_dir / "vllm_metrics_nodrafter.txt").read_text(), MODEL)
    assert not c.has_spec
    assert c.generation_tokens == 15.0
    with pytest.raises(EngineError, match="without a drafter"):
        acceptance_from_counters(c - c, k=3)


def test_counter_reset_is_an_error(fixtures_dir):
    before = SpecCounters.from_text((fixtures_dir / "vllm_metrics_spec_after.txt").read_text(), MODEL)
    after = SpecCounters.from_text((fixtures_dir / "vllm_metrics_spec_before.txt").read_text(), MODEL)
    with pytest.raises(EngineError, match="restarted"):
        _ = after - before


def test_parse_drops_created_and_filters_model(fixtures_dir):
    samples = parse_text((fixtures_dir / "vllm_metrics_spec_after.txt").read_text())
    assert not any(s.name.endswith("_created") for s in samples)
    assert total(samples, "vllm:spec_decode_num_drafts_total", "another-model") is None
    assert total(samples, "vllm:spec_decode_num_drafts_total", MODEL) == 30.0


def test_two_engines_are_summed(fixtures_dir):
    text = (fixtures_dir / "vllm_metrics_spec_after.txt").read_text()
    line = next(x for x in text.splitlines() if x.startswith("vllm:spec_decode_num_drafts_total"))
    doubled = text + line.replace('engine="0"', 'engine="1"') + "\n"
    assert SpecCounters.from_text(doubled, MODEL).drafts == 60.0

"""SGLang: command line for EAGLE-3 and parsers, against real SGLang output (sources in the fixture README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from draftsmith.errors import EngineError
from draftsmith.evaluation.sglang import (
    SGLangRequestSpec,
    SGLangServerSpec,
    acceptance_from_meta_infos,
    parse_sglang_metrics,
)


def test_command_line_for_chain_eagle3():
    cmd = SGLangServerSpec(model=Path("/m/target"), drafter=Path("/m/draft"), k=3, port=30001).command()
    flags = dict(zip(cmd[3::1], cmd[4::1], strict=False))
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert flags["--model-path"] == "/m/target"
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == "/m/draft"
    assert flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-eagle-topk"] == "1"
    assert flags["--speculative-num-draft-tokens"] == "4"  # topk 1: steps + 1
    assert "--enable-metrics" in cmd


def test_real_meta_info_converts_to_the_one_definition(fixtures_dir):
    meta = json.loads((fixtures_dir / "sglang_meta_info_pr33518.json").read_text())
    r = SGLangRequestSpec.from_meta_info(meta)
    assert (r.completion_tokens, r.verify_ct, r.accepted, r.proposed) == (106, 43, 63, 215)
    # SGLang's own figure (completion / verify) equals 1 + accepted / verify: the bonus token is counted
    assert r.engine_accept_length == pytest.approx(106 / 43)
    a = acceptance_from_meta_infos([meta], k=5)
    assert a.mean_acceptance_length == pytest.approx(1 + 63 / 43)
    assert a.mean_acceptance_length == pytest.approx(meta["spec_accept_length"])
    assert a.acceptance_rate == pytest.approx(63 / 215)
    assert a.acceptance_rate == pytest.approx(meta["spec_accept_rate"])
    # histogram [11, 14, 11, 4, 0, 3] over 43 verify passes: passes that accepted more than i drafts
    assert a.per_position == pytest.approx([32 / 43, 18 / 43, 7 / 43, 3 / 43, 3 / 43])
    assert a.mean_acceptance_length == pytest.approx(1 + sum(a.per_position))


def test_old_meta_info_with_only_verify_count(fixtures_dir):
    # SGLang before PR 11441 returned only completion_tokens and spec_verify_ct (PR 3152): accepted drafts are
    # completion_tokens - spec_verify_ct and proposed drafts K per verify pass.
    meta = json.loads((fixtures_dir / "sglang_meta_info_pr33518.json").read_text())
    old = {"completion_tokens": meta["completion_tokens"], "spec_verify_ct": meta["spec_verify_ct"]}
    a = acceptance_from_meta_infos([old, old], k=5)
    assert a.accepted == 2 * 63
    assert a.mean_acceptance_length == pytest.approx(106 / 43)
    assert a.acceptance_rate == pytest.approx(63 / 215)
    assert a.per_position == []  # no histogram, no per-position figure


def test_meta_info_without_speculation_is_refused():
    with pytest.raises(EngineError, match="spec_verify_ct"):
        acceptance_from_meta_infos([{"completion_tokens": 12}], k=3)


def test_docs_metrics_text_has_no_spec_gauges(fixtures_dir):
    g = parse_sglang_metrics((fixtures_dir / "sglang_metrics_docs.txt").read_text())
    assert g.accept_length is None and g.accept_rate is None
    assert g.generation_tokens == 7557572.0


def test_spec_gauges_are_averaged_over_ranks(fixtures_dir):
    # Not recorded: the two gauge lines are written from the names and HELP strings in SGLang's
    # python/sglang/srt/metrics/collector.py and appended to the recorded docs text.
    text = (fixtures_dir / "sglang_metrics_docs.txt").read_text() + (
        "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.5\n'
        'sglang:spec_accept_length{model_name="m",tp_rank="1"} 3.5\n'
    )
    assert parse_sglang_metrics(text).accept_length == pytest.approx(3.0)

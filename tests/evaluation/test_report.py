"""report.json fields, report.md table, report.png, and the Grafana gauges (textfile + in-process)."""

from __future__ import annotations

import json

import pytest
from draftsmith.evaluation.report import build_report, engine_result, write_reports
from draftsmith.evaluation.runner import SetMeasure, overall
from draftsmith.evaluation.sglang import acceptance_from_meta_infos
from draftsmith.evaluation.vllm_metrics import SpecCounters, acceptance_from_counters
from prometheus_client import REGISTRY

FIELDS = {"acceptance_rate", "mean_acceptance_length", "per_position", "output_tokens_per_s",
          "baseline_output_tokens_per_s", "speedup"}


def _vllm_measure(name, drafts, accepted, per_pos, tokens, wall):
    c = SpecCounters(drafts, 3 * drafts, accepted, per_pos, tokens, True)
    return SetMeasure(name=name, requests=2, turns=2, output_tokens=tokens, wall_s=wall,
                      acceptance=acceptance_from_counters(c, 3), counters=c)


def test_reports_and_gauges(tmp_path, fixtures_dir):
    gsm = _vllm_measure("gsm8k", 10, 15, (8.0, 5.0, 2.0), 100, 4.0)
    mt = _vllm_measure("mt_bench", 30, 15, (10.0, 4.0, 1.0), 200, 10.0)
    tot = overall([gsm, mt], "vllm", 3)
    assert tot.acceptance.mean_acceptance_length == pytest.approx(1 + 30 / 40)  # sums first, formula once
    base = [SetMeasure("gsm8k", 2, 2, 100, 5.0), SetMeasure("mt_bench", 2, 2, 200, 20.0)]
    btot = overall(base, "vllm", 3)
    vllm = engine_result("vllm", 3, 0.0, [gsm, mt], tot, base, btot)
    meta = json.loads((fixtures_dir / "sglang_meta_info_pr33518.json").read_text())
    sg = SetMeasure("gsm8k", 1, 1, 106, 2.0, acceptance_from_meta_infos([meta], 3), engine_figure=2.47, metas=[meta])
    sgl = engine_result("sglang", 3, 0.0, [sg], overall([sg], "sglang", 3), None, None)
    report = build_report("demo", "both", 3, 0.0, [vllm, sgl], "target-dir", "drafter-dir")
    paths = write_reports(report, tmp_path)

    data = json.loads(paths["json"].read_text())
    assert data["schema"] == "draftsmith.eval-report/1"
    assert (data["engine"], data["k"], data["temperature"]) == ("both", 3, 0.0)
    v = data["results"][0]
    assert v["engine"] == "vllm" and v["k"] == 3 and v["temperature"] == 0.0
    for entry in [*v["sets"].values(), v["overall"]]:
        assert FIELDS <= set(entry)
    g = v["sets"]["gsm8k"]
    assert g["acceptance_rate"] == pytest.approx(0.5) and g["mean_acceptance_length"] == pytest.approx(2.5)
    assert g["per_position"] == pytest.approx([0.8, 0.5, 0.2])
    assert (g["output_tokens_per_s"], g["baseline_output_tokens_per_s"], g["speedup"]) == (25.0, 20.0, 1.25)
    assert v["overall"]["speedup"] == pytest.approx((300 / 14) / (300 / 25), abs=1e-3)
    s = data["results"][1]["sets"]["gsm8k"]
    assert s["mean_acceptance_length"] == pytest.approx(2.4651) and s["speedup"] is None

    md = paths["md"].read_text()
    assert "| gsm8k | 50.0% | 2.50 | 80.0%, 50.0%, 20.0% | 25.00 | 20.00 | 1.25 |" in md
    assert "## sglang" in md and "bonus token counted" in md
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    prom = paths["prom"].read_text()
    assert 'draftsmith_eval_mean_acceptance_length{engine="vllm",run="demo",set="gsm8k"} 2.5' in prom
    assert 'draftsmith_eval_speedup{engine="vllm",run="demo",set="gsm8k"} 1.25' in prom
    assert 'draftsmith_eval_acceptance_per_position{engine="vllm",position="2",run="demo",set="gsm8k"} 0.2' in prom
    assert REGISTRY.get_sample_value(
        "draftsmith_eval_acceptance_rate", {"run": "demo", "engine": "sglang", "set": "gsm8k"}
    ) == pytest.approx(63 / 215, abs=1e-4)  # SGLang's own proposed-draft count, not K x verify


def test_draft_vocab_coverage_sums_counts_over_sets():
    gsm = _vllm_measure("gsm8k", 10, 15, (8.0, 5.0, 2.0), 100, 4.0)
    mt = _vllm_measure("mt_bench", 30, 15, (10.0, 4.0, 1.0), 200, 10.0)
    gsm.in_draft_vocab, gsm.counted_tokens = 99, 100
    mt.in_draft_vocab, mt.counted_tokens = 150, 200
    tot = overall([gsm, mt], "vllm", 3)
    assert tot.draft_vocab_coverage == pytest.approx(249 / 300)  # counts summed, not the two shares averaged
    res = engine_result("vllm", 3, 0.0, [gsm, mt], tot, None, None)
    assert res["sets"]["gsm8k"]["draft_vocab_coverage"] == 0.99 and res["overall"]["draft_vocab_coverage"] == 0.83
    unknown = SetMeasure("alpaca", 1, 1, 10, 1.0)  # an engine that reports no token ids (SGLang's /generate)
    assert unknown.draft_vocab_coverage is None and overall([unknown], "vllm", 3).draft_vocab_coverage is None


def test_the_report_says_which_build_exported_the_drafter():
    from draftsmith.evaluation.report import render_markdown

    known = build_report("r", "vllm", 3, 0.0, [], "t", "d", drafter_code_version="draftsmith 0.1.0 (git abc1234)")
    assert known["drafter_code_version"] == "draftsmith 0.1.0 (git abc1234)"
    assert "Drafter exported by draftsmith 0.1.0 (git abc1234)." in render_markdown(known).splitlines()
    unknown = build_report("r", "vllm", 3, 0.0, [], "t", "d")
    assert unknown["drafter_code_version"] is None
    assert "records no code_version" in render_markdown(unknown)


def test_a_low_acceptance_points_at_doctor_and_a_good_one_does_not():
    from draftsmith.evaluation.report import DOCTOR_BELOW_RATE, render_markdown

    low = _vllm_measure("mt_bench", 10, 1, [1, 0, 0], 40, 2.0)  # 1 of 30 draft tokens accepted: 3.3 %
    good = _vllm_measure("gsm8k", 10, 9, [5, 3, 1], 40, 2.0)  # 9 of 30: 30 %
    rows = [engine_result("vllm", 3, 0.0, [low], overall([low], "vllm", 3), None, None),
            engine_result("sglang", 3, 0.0, [good], overall([good], "sglang", 3), None, None)]
    md = render_markdown(build_report("r", "vllm", 3, 0.0, rows, "t", "runs/r/export/eagle3")).splitlines()
    pointers = [x for x in md if "draftsmith doctor" in x]
    assert pointers == [f"Acceptance rate 3.3% in vllm is below {100 * DOCTOR_BELOW_RATE:.0f}%: `draftsmith doctor "
                        "--run r --drafter runs/r/export/eagle3` names the likely causes with their evidence and "
                        "fixes (docs/doctor.md)."]

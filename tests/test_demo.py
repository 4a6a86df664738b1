"""`make demo DEMO_SIZE=small` as CI runs it: the whole pipeline on the embedded default, real vLLM CPU, real
SmolLM2; it must print the report with acceptance above zero, and a second run must resume (skip every stage)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = "ci-small"  # the run of the session fixture `small_demo` (tests/conftest.py)


@pytest.mark.e2e
def test_small_demo_prints_report_with_acceptance(small_demo):
    out, run_dir = small_demo
    for stage in ("prepare", "generate", "build-data", "extract", "train", "export", "eval"):
        assert f"== {stage}: start" in out and f"== {stage}: done in" in out
    assert "draftsmith demo report (size small)" in out
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    overall = report["results"][0]["overall"]
    assert report["results"][0]["engine"] == "vllm" and report["k"] == 3
    assert overall["accepted_tokens"] > 0 and overall["acceptance_rate"] > 0
    assert 1.0 < overall["mean_acceptance_length"] <= 4.0
    for f in ("report.json", "report.md", "report.png"):
        assert (run_dir / "eval" / f).stat().st_size > 0
    for d in ("records", "data", "features", "checkpoints", "export/eagle3", "export/speculators"):
        assert any((run_dir / d).iterdir()), d
    state = json.loads((run_dir / "demo.json").read_text())
    assert state["size"] == "small" and all(v["done"] for v in state["stages"].values())


@pytest.mark.e2e
def test_small_demo_resumes_instead_of_redoing(small_demo):
    _, run_dir = small_demo
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    p = subprocess.run(["make", "demo", "DEMO_SIZE=small", f"RUN={RUN}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    for stage in ("generate", "build-data", "extract", "train", "export", "eval"):
        assert f"== {stage}: done earlier" in out
    assert "starting vLLM" not in out
    assert "draftsmith demo report (size small)" in out

"""bench/recipe.py's baseline row taken from the run itself (``--baseline-from-run``).

The fixture ``tests/fixtures/bench/demo-run`` is recorded real output of one float32 ``make demo`` (default size,
2026-12-02): its ``status/train.json``, ``demo.json`` and the vLLM CPU eval report (K = 3, T = 0).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "bench" / "demo-run"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("bench_recipe", REPO / "bench" / "recipe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_baseline_row_comes_from_the_runs_own_training_and_eval(recipe, tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "demo")
    row = recipe.result_of_run(tmp_path, "demo", "baseline")
    assert row["steps"] == 312 and row["train_s"] == 1058.0 and row["from_run"] == "demo"
    assert row["heldout"]["accept_len"] == pytest.approx(1.5368, abs=1e-4)
    assert row["vllm"]["overall"] == pytest.approx(1.4147, abs=1e-3)
    assert set(row["vllm"]["sets"]) == {"mt_bench", "gsm8k", "humaneval", "alpaca"}
    assert row["vllm"]["sets"]["gsm8k"] == pytest.approx(1.5898, abs=1e-4)
    line = recipe.table([row]).splitlines()[-1]
    assert line.startswith("| baseline | 1058 | 312 | 1.537 |") and "1.33 / 1.59 / 1.51 / 1.35" in line


def test_baseline_from_an_unfinished_run_says_what_to_do(recipe, tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "demo")
    (tmp_path / "demo" / "eval" / "report.json").unlink()
    with pytest.raises(SystemExit, match="no finished training and eval"):
        recipe.result_of_run(tmp_path, "demo", "baseline")

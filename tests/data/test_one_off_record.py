"""The one-off stages (`make data`, `make train`, `make eval`) against the run's record: the real console entry
point in a subprocess, real record shards of SmolLM2 and the real tokenizer. A key left unset is taken from the
record; a key an earlier stage recorded, set to another value, is refused with both values before anything is
written; a stage that starts its output over (build-data) records its own new values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_records
from draftsmith.artifacts.run_settings import record
from draftsmith.cli.run_record import check_stage, record_stage
from draftsmith.config import load_settings
from draftsmith.errors import RunSettingsMismatch

SMOL = "SmolLM2-135M-Instruct"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every file of the run with its bytes: what 'nothing was written' is checked against."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _recorded(root: Path) -> dict:
    return json.loads((root / "run-settings.json").read_text())["sections"]


def test_data_train_eval_check_the_runs_record(tmp_path, embedded_target, smollm2_records):
    runs = tmp_path / "runs"
    root = runs / "r1"
    write_records(root / "records", smollm2_records)
    # the generation enqueue recorded the target it served (what `make enqueue` writes)
    record(root, {"target": {"model": SMOL}, "generation": {"max_tokens": 64}}, ("target", "generation"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSMITH_")}
    env.update(DRAFTSMITH_RUNS_DIR=str(runs), DRAFTSMITH_TARGET__PATH=str(embedded_target))

    # make data: target.model unset in its container -> the run's; data.* first set here -> recorded
    r = _cli(["build-data", "--run", "r1", "--max-length", "128", "--draft-vocab-size", "20"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"continuing with the run's recorded target.model='{SMOL}'" in r.stderr
    rec = _recorded(root)
    assert rec["target"] == {"model": SMOL} and rec["generation"] == {"max_tokens": 64}
    assert rec["data"]["max_length"] == 128 and rec["data"]["draft_vocab_size"] == 20
    before = _files(root)

    # a data container configured for another target: refused, both values named, nothing written
    r = _cli(["build-data", "--run", "r1"], {**env, "DRAFTSMITH_TARGET__MODEL": "other/model"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"target.model: this command 'other/model', run '{SMOL}'" in r.stderr
    assert "RUN=<new name>" in r.stderr and "Nothing was written" in r.stderr and "Traceback" not in r.stderr
    assert _files(root) == before

    # make train with another data.max_length than the data was built with: refused before anything loads
    r = _cli(["train", "--run", "r1"], {**env, "DRAFTSMITH_DATA__MAX_LENGTH": "256"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        "make train (draftsmith train)" in r.stderr
        and "data.max_length: this command 256, run 128" in r.stderr
    )
    assert _files(root) == before and not (root / "checkpoints").exists()

    # make eval for another target: refused the same way, no report, no record of eval
    r = _cli(["eval", "--run", "r1", "--url", "http://127.0.0.1:9"], {**env, "DRAFTSMITH_TARGET__MODEL": "x"})
    assert r.returncode == 2 and f"target.model: this command 'x', run '{SMOL}'" in r.stderr, r.stderr[-2000:]
    assert _files(root) == before

    # build-data starts its output over: its own keys may change, and the record says so
    r = _cli(["build-data", "--run", "r1", "--max-length", "256"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "data.max_length: 128 -> 256" in r.stderr
    # the vocabulary size nobody set this time is the run's
    assert "data.draft_vocab_size=20" in r.stderr
    rec = _recorded(root)
    assert rec["data"]["max_length"] == 256 and rec["data"]["draft_vocab_size"] == 20
    assert json.loads((root / "data" / "manifest.json").read_text())["max_length"] == 256


def test_eval_measures_again_with_its_own_new_keys(tmp_path):
    """eval starts its output over (a new report): its own keys may change and are recorded; target's may not."""
    runs = tmp_path / "runs"
    (runs / "e").mkdir(parents=True)
    record(runs / "e", {"target": {"model": SMOL}}, ("target",))
    first = load_settings(None, {"runs_dir": str(runs), "run": "e", "eval": {"k": 3}})
    s, taken = check_stage(first, "eval")
    assert s.target.model == SMOL and taken == [f"target.model='{SMOL}'"]
    assert record_stage(s, "eval") == []
    s, _ = check_stage(load_settings(None, {"runs_dir": str(runs), "run": "e", "eval": {"k": 5}}), "eval")
    assert record_stage(s, "eval") == ["eval.k: 3 -> 5"]
    assert _recorded(runs / "e")["eval"]["k"] == 5
    with pytest.raises(
        RunSettingsMismatch, match=r"target.model: this command 'm2', run 'SmolLM2-135M-Instruct'"
    ):
        check_stage(
            load_settings(None, {"runs_dir": str(runs), "run": "e", "target": {"model": "m2"}}), "eval"
        )


def test_a_target_recorded_as_any_pins_nothing(tmp_path):
    """An enqueue without a model name records target.model None (the only model the server serves): a later stage
    may name the model."""
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    record(runs / "a", {"target": {"model": None}, "data": {"max_length": 128}}, ("target", "data"))
    s, taken = check_stage(
        load_settings(None, {"runs_dir": str(runs), "run": "a", "target": {"model": SMOL}}), "train"
    )
    assert s.target.model == SMOL and s.data.max_length == 128 and taken == ["data.max_length=128"]


def test_the_refresh_loop_and_the_gateway_take_the_runs_recorded_recipe_and_temperature(tmp_path):
    """A refresh or gateway container with none of the run's lines in its environment: the run's data, extraction
    and training recipe and its generation temperature come from the record; a run key given otherwise is refused."""
    runs = tmp_path / "runs"
    record(runs / "r", {"generation": {"temperature": 0.7}, "data": {"draft_vocab_size": 1024, "max_length": 512},
                        "train": {"init_rope": "drafter", "max_steps": 12}}, ("generation", "data", "train"))
    s = load_settings(None, {"runs_dir": str(runs), "run": "r"})
    refresh, taken = check_stage(s, "refresh")
    assert (refresh.data.draft_vocab_size, refresh.data.max_length, refresh.train.init_rope,
            refresh.train.max_steps, refresh.generation.temperature) == (1024, 512, "drafter", 12, 0.7)
    assert "data.draft_vocab_size=1024" in taken
    gateway, _ = check_stage(s, "gateway")
    assert gateway.generation.temperature == 0.7 and gateway.data.draft_vocab_size == s.data.draft_vocab_size
    other = load_settings(None, {"runs_dir": str(runs), "run": "r", "data": {"draft_vocab_size": 4096}})
    with pytest.raises(RunSettingsMismatch, match="data.draft_vocab_size: this command 4096, run 1024"):
        check_stage(other, "refresh")

"""Every config key is a run key (what the run is: carried by its queued jobs) or a host key (how a service does it:
from that service's own environment), marked in the schema; a worker merges a job's run keys into its own
settings; the run's record refuses a job whose run keys disagree with it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from draftsmith.config import key_kinds, load_settings, run_settings, with_run_settings
from draftsmith.errors import ConfigError


def test_every_key_has_a_kind_and_the_issue_s_examples_are_right():
    kinds = key_kinds()
    assert set(kinds.values()) == {"run", "host"} and len(kinds) > 120
    for key in ("extract.backend", "extract.device", "extract.tensor_parallel_size", "extract.enable_expert_parallel",
                "extract.batch_tokens", "target.url", "target.api_key", "target.path", "redis.url", "runs_dir",
                "generation.concurrency", "generation.request_timeout_s", "train.device", "metrics.port"):
        assert kinds[key] == "host", key
    for key in ("run", "extract.layers", "extract.dtype", "data.max_length", "data.draft_vocab_size",
                "generation.max_tokens", "generation.temperature", "target.model", "train.lr", "train.ttt_steps",
                "export.format"):
        assert kinds[key] == "run", key


def test_a_section_field_without_a_kind_is_refused_when_the_class_is_built():
    from draftsmith.config_kinds import Host, Section
    from pydantic import Field

    class Fine(Section):
        a: int = Host(1, description="a")

    assert Fine().a == 1
    with pytest.raises(TypeError, match="Bad.b has no kind"):
        class Bad(Section):
            b: int = Field(1, description="b")


def test_a_job_carries_only_run_keys_and_no_secret():
    s = load_settings(overrides={"target": {"api_key": "sk-secret", "url": "http://u:pw@10.0.0.1:8000"},
                                 "redis": {"url": "redis://:hunter2@10.0.0.5:6379/0"},
                                 "extract": {"backend": "vllm", "layers": [2, 15, 27]}})
    carried = run_settings(s)
    assert carried["extract"] == {"layers": [2, 15, 27], "dtype": "bfloat16"}
    assert "redis" not in carried and "metrics" not in carried and carried["target"] == {"model": None}
    text = repr(carried)
    assert "sk-secret" not in text and "hunter2" not in text and "10.0.0" not in text


def test_the_worker_s_host_keys_win_and_the_job_s_run_keys_win(monkeypatch):
    enqueuer = load_settings(overrides={"extract": {"backend": "hf", "device": "cpu", "layers": None,
                                                    "tensor_parallel_size": 1}, "generation": {"max_tokens": 77}})
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__BACKEND", "vllm")
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__TENSOR_PARALLEL_SIZE", "8")
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__LAYERS", "[2,15,27]")  # a run key in the worker's env: the job's wins
    monkeypatch.setenv("DRAFTSMITH_GENERATION__MAX_TOKENS", "5")
    worker = load_settings()
    s, ignored = with_run_settings(worker, run_settings(enqueuer))
    assert (s.extract.backend, s.extract.tensor_parallel_size) == ("vllm", 8)
    assert s.extract.layers is None and s.generation.max_tokens == 77 and ignored == []
    # what counts as set (a target-profile default fills the rest) is the worker's own plus the job's keys
    assert {"backend", "tensor_parallel_size", "layers", "dtype"} <= s.extract.model_fields_set
    assert "temperature" in s.generation.model_fields_set and "concurrency" not in s.generation.model_fields_set
    # a job of an older draftsmith carries every key: its host keys are ignored, the worker's apply
    s, ignored = with_run_settings(worker, enqueuer.model_dump(mode="json"))
    assert s.extract.backend == "vllm" and "extract.backend" in ignored and "redis.url" in ignored
    with pytest.raises(ConfigError, match="unknown config key 'extract.bakcend'"):
        with_run_settings(worker, {"extract": {"bakcend": "hf"}})
    with pytest.raises(ConfigError, match="invalid value for 'generation.max_tokens'"):
        with_run_settings(worker, {"generation": {"max_tokens": 0}})


def test_the_run_s_record_refuses_a_job_that_disagrees_naming_both_values(tmp_path):
    from draftsmith.artifacts.run_settings import check_job, read_record, record

    run = tmp_path / "runs" / "t"
    a = run_settings(load_settings(overrides={"extract": {"layers": [1, 14, 26]}}))
    b = run_settings(load_settings(overrides={"extract": {"layers": [2, 15, 27]}}))
    check_job(run, a, ("extract",), "job x", "draftsmith extract")  # no record yet: nothing to compare
    assert record(run, a, ("extract",)) == []
    check_job(run, a, ("extract",), "job x", "draftsmith extract")
    doc = read_record(run)
    assert doc["sections"] == {"extract": {"layers": [1, 14, 26], "dtype": "bfloat16"}}
    assert doc["recorded"]["extract"]["code_version"].startswith("draftsmith")
    assert record(run, b, ("extract",)) == ["extract.layers: [1, 14, 26] -> [2, 15, 27]"]
    with pytest.raises(ConfigError) as e:
        check_job(run, a, ("extract",), "job x", "draftsmith extract")
    assert "extract.layers: job [1, 14, 26], run [2, 15, 27]" in str(e.value)
    assert "draftsmith extract" in str(e.value) and "run-settings.json" in str(e.value)
    check_job(run, a, ("generation",), "job x", "draftsmith enqueue")  # a section the record lacks is not compared


def test_draftsmith_config_shows_each_key_s_kind():
    p = subprocess.run([sys.executable, "-m", "draftsmith", "config", "--kind", "host"], capture_output=True,
                       text=True, timeout=60, env={"COLUMNS": "250", "PATH": ""})
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if "extract." in line]
    assert any("extract.backend" in r and "host" in r for r in rows)
    assert not any("extract.layers" in r for r in rows)  # a run key: left out by --kind host


def test_an_enqueue_without_its_flags_continues_the_run_as_recorded(tmp_path, monkeypatch):
    """A resume (`draftsmith enqueue` again, no flags) takes the run keys it does not set from the record, so its
    jobs agree with the ones still queued; a key it sets is kept (and recorded as the run's change)."""
    from draftsmith.artifacts.run_settings import record
    from draftsmith.config import adopt_recorded

    run = tmp_path / "runs" / "t"
    first = load_settings(overrides={"generation": {"max_tokens": 8, "batch_size": 4}})
    record(run, run_settings(first), ("target", "generation"))
    resume, adopted = adopt_recorded(load_settings(), run, ("target", "generation"))
    assert sorted(adopted) == ["generation.batch_size", "generation.max_tokens"]
    assert (resume.generation.max_tokens, resume.generation.batch_size) == (8, 4)
    assert "temperature" in resume.generation.model_fields_set  # recorded: no target default replaces it
    monkeypatch.setenv("DRAFTSMITH_GENERATION__MAX_TOKENS", "16")  # set, by the environment: kept
    changed, adopted = adopt_recorded(load_settings(), run, ("target", "generation"))
    assert adopted == ["generation.batch_size"] and changed.generation.max_tokens == 16
    assert adopt_recorded(first, tmp_path / "runs" / "new", ("generation",)) == (first, [])

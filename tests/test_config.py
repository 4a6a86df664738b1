"""The one config schema: YAML file < environment < flags, unknown keys rejected, every field documented, and the
CLI's one-line error with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from draftsmith.config import Settings, describe_fields, load_settings
from draftsmith.errors import ConfigError


def test_precedence_file_env_flags(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: from-file\ngeneration:\n  concurrency: 7\n  max_tokens: 11\n")
    monkeypatch.setenv("DRAFTSMITH_GENERATION__CONCURRENCY", "9")
    s = load_settings(cfg, {"generation": {"max_tokens": 13, "batch_size": None}})
    assert s.run == "from-file"
    assert s.generation.concurrency == 9  # env beats the file
    assert s.generation.max_tokens == 13  # flags beat both
    assert s.generation.batch_size == 64  # None flags are ignored: the default stays


def test_unknown_keys_are_rejected_everywhere(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("generation:\n  concurency: 7\n")
    with pytest.raises(ConfigError, match="unknown config key 'generation.concurency'"):
        load_settings(cfg)
    monkeypatch.setenv("DRAFTSMITH_TRAIN__EPOCS", "3")
    with pytest.raises(ConfigError, match="unknown config key 'train.epocs'"):
        load_settings(None)


def test_invalid_values_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="'generation.concurrency'"):
        load_settings(None, {"generation": {"concurrency": 0}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml")


def test_every_field_has_a_default_and_a_doc():
    rows = describe_fields(Settings)
    assert len(rows) > 80
    missing = [key for key, _, doc in rows if not doc.strip()]
    assert missing == []


def test_every_draftsmith_variable_the_repository_names_is_a_config_key():
    """The loader rejects a ``DRAFTSMITH_*`` variable that names no key, so the suite's and the benchmarks' own
    variables are ``TEST_DRAFTSMITH_*`` and ``BENCH_DRAFTSMITH_*``; every ``DRAFTSMITH_*`` name in the code, the
    scripts and the docs is the config file variable or a key (a section alone, as in ``DRAFTSMITH_TARGET__``,
    is a prefix in prose; an entry of a mapping key, ``DRAFTSMITH_DATA__TEMPLATE_KWARGS__ENABLE_THINKING``, names
    its key). This file names wrong ones on purpose and is left out."""
    import re

    from draftsmith.config import CONFIG_FILE_VARIABLE

    repo = Path(__file__).resolve().parents[1]
    keys = {k for k, _, _ in describe_fields()} | set(Settings.model_fields)
    seen, bad = set(), []
    for path in repo.rglob("*"):
        if any(part in (".venv", ".git", "runs", ".peer-venv", "node_modules") for part in path.parts) \
                or path == Path(__file__).resolve() or not path.is_file() or path.suffix not in (".py", ".sh", ".md", ".yaml", ".yml", ".example", ""):
            continue
        for name in re.findall(r"\bDRAFTSMITH_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")):
            seen.add(name)
            key = name.removeprefix("DRAFTSMITH_").lower().replace("__", ".")
            key = "data.template_kwargs" if key.startswith("data.template_kwargs.") else key
            if name != CONFIG_FILE_VARIABLE and key not in keys:
                bad.append(f"{path.relative_to(repo)}: {name}")
    assert len(seen) > 20 and bad == []


def test_a_variable_of_the_prefix_that_names_no_key_is_rejected(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_TEST_ANYTHING", "x")
    with pytest.raises(ConfigError, match="unknown config key 'test_anything'"):
        load_settings(None)


def test_cli_prints_one_line_and_exits_2_before_touching_anything(tmp_path):
    env = {**os.environ, "DRAFTSMITH_GENERATION__CONCURENCY": "3", "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "enqueue", "--source", "nowhere.jsonl"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown config key 'generation.concurency'" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_lists_and_mappings_from_the_environment_are_json(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("extract:\n  layers: [2, 3, 4]\neval:\n  sets: [mt_bench]\n")
    monkeypatch.setenv("DRAFTSMITH_EXTRACT__LAYERS", "[1,14,26]")
    monkeypatch.setenv("DRAFTSMITH_DATA__TEMPLATE_KWARGS", '{"enable_thinking": false}')
    monkeypatch.setenv("DRAFTSMITH_TRAIN__BETAS", "[0.8, 0.9]")
    s = load_settings(cfg, {"eval": {"sets": ["gsm8k", "alpaca"]}})
    assert s.extract.layers == [1, 14, 26]  # env beats the file
    assert s.data.template_kwargs == {"enable_thinking": False}
    assert s.train.betas == (0.8, 0.9)
    assert s.eval.sets == ["gsm8k", "alpaca"]  # flags beat the file
    monkeypatch.setenv("DRAFTSMITH_EVAL__SETS", '["humaneval"]')
    assert load_settings(cfg).eval.sets == ["humaneval"]


def test_a_list_that_is_not_json_names_the_variable(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_TARGET__EXTRA_ARGS", "--swap-space 4")
    with pytest.raises(ConfigError, match="DRAFTSMITH_TARGET__EXTRA_ARGS is not valid JSON"):
        load_settings(None)


def test_unknown_top_level_variable_is_rejected(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_RUNZ", "x")
    with pytest.raises(ConfigError, match="unknown config key 'runz'"):
        load_settings(None)


def test_cli_config_reads_a_list_from_the_environment(tmp_path):
    env = {**os.environ, "DRAFTSMITH_EXTRACT__LAYERS": "[1,14,26]", "DRAFTSMITH_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "draftsmith", "config"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr  # the table of keys, exactly what the command ran
    p = subprocess.run([sys.executable, "-m", "draftsmith", "config", "--show"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "  layers:\n  - 1\n  - 14\n  - 26\n" in p.stdout

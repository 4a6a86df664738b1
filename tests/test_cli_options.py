"""Flags that mirror a setting are declared once, in the schema: help and default come from the field."""

from __future__ import annotations

import click
import pytest
import typer
from draftsmith.cli import app
from draftsmith.cli.options import setting_default, setting_field, setting_help
from draftsmith.config import Settings

# flag of each command -> the setting it sets (what the command passes to `settings(...)`)
MIRRORED = {
    "train": {"--family": "train.family", "--ttt-steps": "train.ttt_steps", "--max-steps": "train.max_steps", "--epochs": "train.epochs",
              "--lr": "train.lr", "--draft-vocab-size": "train.draft_vocab_size", "--init-from": "train.init_from"},
    "export": {"--format": "export.format"},
    "enqueue": {"--batch-size": "generation.batch_size", "--url": "target.url", "--model": "target.model",
                "--max-tokens": "generation.max_tokens"},
    "worker": {"--concurrency": "generation.concurrency", "--metrics-port": "metrics.port"},
    "eval": {"--engine": "eval.engine", "--sets": "eval.sets", "--k": "eval.k", "--url": "eval.url",
             "--limit": "eval.limit", "--concurrency": "eval.concurrency", "--max-tokens": "eval.max_tokens"},
    "extract": {"--backend": "extract.backend", "--dtype": "extract.dtype"},
    "build-data": {"--max-length": "data.max_length", "--draft-vocab-size": "data.draft_vocab_size"},
}


def _command(name: str) -> click.Command:
    group = typer.main.get_command(app)
    return group.commands[name]


@pytest.mark.parametrize("command", sorted(MIRRORED))
def test_mirrored_flags_take_the_schemas_description_and_default(command):
    params = {opt: p for p in _command(command).params for opt in p.opts}
    for flag, path in MIRRORED[command].items():
        p = params[flag]
        desc = setting_field(path).description
        assert desc and p.help.startswith(desc.rstrip()), (flag, p.help)
        assert f"(setting {path}, default " in p.help
        assert p.default is None, f"{flag} must leave the value to the settings' layers"


def test_the_help_shows_the_schema_default():
    assert setting_default("generation.concurrency") == Settings().generation.concurrency == 128
    assert setting_help("generation.concurrency").endswith("(setting generation.concurrency, default 128)")
    assert setting_default("eval.sets") == Settings().eval.sets  # a default factory's value
    with pytest.raises(KeyError):
        setting_field("train.no_such_field")


def test_a_flag_still_beats_the_environment(tmp_path, monkeypatch):
    """The flag's None default leaves the environment's value; a given flag overrides it."""
    from draftsmith.cli import settings

    monkeypatch.setenv("DRAFTSMITH_TRAIN__EPOCHS", "5")
    assert settings().train.epochs == 5
    assert settings(train={"epochs": 2}).train.epochs == 2
    assert settings(train={"epochs": None}).train.epochs == 5

"""The ``draftsmith`` command line: one typer app; each stage registers its commands from its own module.

Command modules import heavy libraries (torch, transformers, prometheus_client) inside the command functions, so
``draftsmith --help`` is instant and the worker can set ``PROMETHEUS_MULTIPROC_DIR`` before metrics are imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from draftsmith.config import load_settings, secrets_of
from draftsmith.errors import DraftsmithError, Interrupted, is_disk_full
from draftsmith.log import setup_logging
from draftsmith.signals import command

app = typer.Typer(
    name="draftsmith",
    help="Train EAGLE-3 drafters: regenerate answers with the target, build data, extract features, train, "
    "export, and measure acceptance in vLLM and SGLang.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_STATE: dict[str, Any] = {"config": None, "log_level": None}


@app.callback()
def _root(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config file (same keys as `draftsmith config`).", envvar="DRAFTSMITH_CONFIG"
    ),
    log_level: str | None = typer.Option(None, "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    _STATE["config"] = config
    _STATE["log_level"] = log_level


def settings(**overrides: Any):
    """Load and validate the settings for a command, with its flags as overrides, and set up logging.

    ``overrides`` is a nested dict (``{"generation": {"concurrency": 8}, "run": "demo"}``); None values are ignored.

    Raises:
        ConfigError: see :func:`draftsmith.config.load_settings`.
    """
    if _STATE.get("log_level"):
        overrides = {**overrides, "log_level": _STATE["log_level"].upper()}
    s = load_settings(_STATE.get("config"), overrides)
    setup_logging(s.log_level, secrets_of(s))
    return s


# Stage modules register their commands on `app` when imported, in pipeline order (the order of --help).
from draftsmith.cli import target, plan, generate, data, extract, train, eval, canary, refresh, doctor, demo, stack, gateway, config_cmd  # noqa: E402,F401,I001

# Commands that run until stopped: a signal is their normal end (exit 0). Every other command is a batch command:
# a signal stops it with one "stopped by" line and exit code 128 + signal (draftsmith.signals, docs/signals.md).
SERVICES = frozenset({"worker", "queue-exporter", "target serve", "gateway", "refresh"})


def _apply_signal_convention(typer_app: typer.Typer, prefix: str = "") -> list[str]:
    """Wrap every command of ``typer_app`` (and of its sub-apps) with :func:`draftsmith.signals.command`; returns
    the full names of the commands wrapped (``"target serve"``)."""
    names = []
    for info in typer_app.registered_commands:
        name = prefix + (info.name or info.callback.__name__.lower().replace("_", "-"))
        info.callback = command(info.callback, name, service=name in SERVICES)
        names.append(name)
    for group in typer_app.registered_groups:
        names += _apply_signal_convention(group.typer_instance, f"{prefix}{group.name} ")
    return names


COMMANDS = _apply_signal_convention(app)


def main() -> None:
    """Console entry point: user errors print one line and exit with code 2; a signal ends a command as
    :data:`SERVICES` and :func:`draftsmith.signals.command` say; bugs keep their traceback."""
    try:
        app()
    except Interrupted as e:  # plain print: a path in the line must not be read as rich markup
        print(e, file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except DraftsmithError as e:
        from rich.console import Console

        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {e}")
        sys.exit(e.exit_code)
    except OSError as e:
        if not is_disk_full(e):
            raise
        where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
        print(f"error: the disk is full{where} ({e.strerror or e}) -> free some space or point runs_dir at a bigger "
              "disk, then run the command again: finished work is kept", file=sys.stderr)
        sys.exit(2)
